import sys

from proto.cli import main

sys.exit(main())

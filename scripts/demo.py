"""``python scripts/demo.py [--url URL] [--model NAME]``: the demo, without the console script.

Everything lives in ``proto.demo`` so ``responses-lab demo`` and this script cannot drift apart.
"""

from __future__ import annotations

import sys

from proto.demo import main

if __name__ == "__main__":
    sys.exit(main())

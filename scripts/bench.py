"""The latency lab without the console script: ``python scripts/bench.py [bench flags]``.

Same flags as ``responses-lab bench`` (see ``--help``); e.g. the full sweep of NOTES.md:
``python scripts/bench.py --model mock-65tps,mock-1000tps,mock-4000tps --workload coding-agent,long-context``.
"""

from __future__ import annotations

import sys

from proto.lab.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

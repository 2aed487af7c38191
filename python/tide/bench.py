"""`python -m tide.bench [args]`: the tide-bench program (see tide.tools)."""

import sys

from .tools import bench_main

if __name__ == "__main__":
    sys.exit(bench_main())

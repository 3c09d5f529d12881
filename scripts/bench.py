#!/usr/bin/env python3
"""Benchmark of the three operators against PyTorch; the same as `python -m infiniop_py bench`."""

import sys

from infiniop_py import bench

if __name__ == "__main__":
    sys.exit(bench.main())

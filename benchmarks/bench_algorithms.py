#!/usr/bin/env python
"""Accuracy and communication of every algorithm vs the number of workers:
the same as `ibtmpi bench run` (T1: every algorithm for N in --ns, real MPI
where the cores allow and simulation beyond; T2: the paper's fixed-block
experiment; then the report with T3). Kept as a script for discoverability.

Usage: python benchmarks/bench_algorithms.py [--ns 1,2,4,8] [--passes 3] ...
(every option of `ibtmpi bench run --help`)
"""
import sys

from ibtmpi.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "run", *sys.argv[1:]]))

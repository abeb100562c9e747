#!/usr/bin/env python
"""The bitwise regression check under benchmarks/, where the benchmarks
are: runs tools/regression_z.py with the same arguments (see its
docstring: `--against COMMIT --strict`)."""
import os
import runpy

if __name__ == "__main__":
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools",
                                "regression_z.py"), run_name="__main__")

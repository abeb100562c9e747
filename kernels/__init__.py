"""CUDA C sources of the GPU backend (installed as ``ibtmpi.kernels``).

One ``.cu`` file per op family, ``extern "C" __global__`` kernels loaded by
the backend module with CuPy. ``source_path(name)`` finds a source file both
in an installed package and in a source checkout.
"""
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent


def source_path(name):
    p = SOURCE_DIR / name
    if not p.is_file():
        raise FileNotFoundError(f"CUDA source {name} not found in {SOURCE_DIR}")
    return p


def sources():
    return sorted(SOURCE_DIR.glob("*.cu"))

#!/usr/bin/env bash
# GPU checks for a single-GPU machine with CUDA, CuPy, PyTorch, mpi4py and
# pytest preinstalled and no network. Writes everything under OUTDIR.
#   bash benchmarks/gpu_check.sh OUTDIR
# Covers: nvidia-smi; every kernels/*.cu compiled by CuPy on the real
# toolkit; the gpu-marked tests (each CuPy launch vs the NumPy reference).
# Not yet covered: the training step vs cuDNN and the 2-worker MPI run,
# which need the trainer's --device gpu path (see the GPU issue's notes).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
site=$(mktemp -d)
# our package only (numpy, cupy, pytest come from the machine)
python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$site" . \
    >"$out/install.log" 2>&1 || { echo "install failed:"; cat "$out/install.log"; exit 1; }
export PYTHONPATH="$site"
nvidia-smi >"$out/nvidia-smi.txt" 2>&1
python3 - <<'PY' 2>&1 | tee "$out/compile.txt"
import cupy
from ibtmpi.kernels import sources
for s in sources():
    m = cupy.RawModule(code=s.read_text(), options=("--std=c++14",))
    m.compile()
    print(f"{s.name}: compiled by CuPy {cupy.__version__} for {cupy.cuda.Device().compute_capability}")
PY
python3 -m pytest -m gpu tests/gpu -ra -q -p no:cacheprovider -o addopts="" 2>&1 | tee "$out/gpu_tests.txt"

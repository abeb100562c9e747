# Shared by benchmarks/gpu_check.sh and benchmarks/gpu_e2e.sh (sourced, not
# run): stages under time limits within one budget, the install of this tree,
# the environment stages and the mpiexec of this machine. The caller sets
# budget (seconds) and calls begin first.

# begin SCRIPT OUTDIR: OUTDIR made, its absolute path in out, stages.txt in
# it empty, tmp a scratch directory removed on exit, the working directory
# the repository's root
begin() {
    out=${2:?usage: $1 OUTDIR}
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    : >"$out/stages.txt"
}

# stage NAME SECONDS LOG CMD...: run CMD with a time limit (at most what is
# left of the budget), its output shown and appended to LOG, its outcome
# appended to stages.txt; returns CMD's status and leaves its wall time in
# stage_s (seconds, to the millisecond). reserve: seconds of the budget kept
# for later stages (0 unless set)
stage() {
    local name=$1 secs=$2 log=$3 t0=$SECONDS rc how ns
    local left=$((budget - ${reserve:-0} - SECONDS))
    shift 3
    stage_s=
    if [ "$left" -lt 10 ]; then
        echo "$name: SKIPPED (the ${budget} s budget is spent)" | tee -a "$out/stages.txt"
        return 125
    fi
    [ "$secs" -gt "$left" ] && secs=$left
    ns=$(date +%s%N)
    timeout -k 10 "$secs" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    ns=$((($(date +%s%N) - ns) / 1000000))
    stage_s=$(printf "%d.%03d" $((ns / 1000)) $((ns % 1000)))
    case $rc in
        0) how=ok ;;
        124 | 137) how="TIMED OUT (limit ${secs} s)" ;;
        *) how="FAILED (exit $rc)" ;;
    esac
    echo "$name: $how, $((SECONDS - t0)) s" | tee -a "$out/stages.txt"
    return "$rc"
}

# install_tree SITE: our package from this tree into SITE (--no-deps; pip
# needs setuptools for a build without isolation, which a bare Python 3.12
# lacks: then the package is laid out by hand, as setup.py's package_dir),
# SITE first on PYTHONPATH
install_tree() {
    local site=$1
    if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$site" . \
            >"$site.log" 2>&1; then
        echo "pip could not install (no setuptools?); copying the package tree instead:"
        tail -n 3 "$site.log"
        rm -rf "$site" && mkdir -p "$site"
        cp -r ibtmpi "$site/ibtmpi" && cp -r kernels "$site/ibtmpi/kernels" \
            && cp -r data_prep "$site/ibtmpi/data_prep" || { echo "copy failed"; exit 1; }
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
}

# env_stages ENVFILE: nvidia-smi, the imports, what ibtmpi sees (MPI
# library, CuPy's devices, CUDA-aware MPI or not) and every kernels/*.cu
# compiled by CuPy on this toolkit (which also fills CuPy's kernel cache)
env_stages() {
    local env=$1
    nvidia-smi >"$env" 2>&1
    stage imports 60 "$env" python3 -c \
        "import numpy, h5py, threadpoolctl, tqdm, PIL, cupy, mpi4py; print('imports ok')"
    stage info 60 "$env" python3 -m ibtmpi info
    stage compile 180 "$env" python3 - <<'PY'
import cupy
from ibtmpi.kernels import sources
for s in sources():
    cupy.RawModule(code=s.read_text(), options=("--std=c++14",)).compile()
    print(f"{s.name}: compiled by CuPy {cupy.__version__} for sm_{cupy.cuda.Device().compute_capability}")
PY
}

# mpi_launcher N: true when an mpiexec exists and mpi4py loads its MPI; then
# mpiexec holds the launch command for N ranks here (Open MPI: --oversubscribe
# on fewer cores, as root --allow-run-as-root; the caller adds -n) and py this
# interpreter's full path for the ranks to start: Open MPI started by its full
# path (as launcher.command gives it) puts its own prefix's bin first on the
# ranks' PATH, where `python3` is another Python (seen on the GPU machine:
# the system's, without the packages)
mpi_launcher() {
    # Open MPI refuses root without these; MPICH ignores them
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    command -v mpiexec >/dev/null && timeout 60 python3 -c "from mpi4py import MPI" >/dev/null 2>&1 \
        || return 1
    mpiexec=$(python3 -c "from ibtmpi import launcher; print(' '.join(launcher.command($1)))")
    py=$(python3 -c "import sys; print(sys.executable)")
}

#!/usr/bin/env bash
# Submit one run per N = 1 2 4 8 16 32 (N workers + master), then a job that
# collects them with `ibtmpi bench report` when all have ended.
#   bash slurm/sweep.sh examples/paper25k.toml [TEMPLATE] [--set k=v ...]
# TEMPLATE defaults to slurm/cpu.sbatch (slurm/gpu-node.sbatch for GPUs).
set -euo pipefail
CONFIG=${1:?usage: slurm/sweep.sh CONFIG.toml [TEMPLATE] [--set k=v ...]}
shift
TEMPLATE=slurm/cpu.sbatch
if [ $# -gt 0 ] && [ -f "$1" ]; then TEMPLATE=$1; shift; fi
OUT=${IBTMPI_SWEEP_DIR:-runs/sweep}
VENV=${IBTMPI_VENV:-$PWD/.venv}
# the configuration and the data checked once, here, before anything is
# queued (a dry run with 2 simulated workers; IBTMPI_SWEEP_CHECK=0 skips it)
if [ "${IBTMPI_SWEEP_CHECK:-1}" = 1 ]; then
    chk=$(mktemp -d)
    if ! "$VENV/bin/ibtmpi" train --dry-run --simulate 2 --config "$CONFIG" "$@" \
            --set run.dir="$chk/r" >/dev/null; then
        rm -rf "$chk"
        echo "sweep: nothing submitted; fix the error above" >&2
        exit 2
    fi
    rm -rf "$chk"
fi
mkdir -p "$OUT"
ids=()
for n in ${IBTMPI_SWEEP_NS:-1 2 4 8 16 32}; do
    algo_args=()
    [ "$n" -eq 1 ] && algo_args=(--set algorithm.name=sgd)
    id=$(sbatch --parsable --ntasks=$((n == 1 ? 1 : n + 1)) --job-name="ibtmpi-n$n" \
         --output="$OUT/n$n-%j.out" "$TEMPLATE" "$CONFIG" \
         --set run.dir="$OUT/t1-n$n" "${algo_args[@]}" "$@")
    echo "N=$n: job $id"
    ids+=("$id")
done
dep=$(IFS=:; echo "${ids[*]}")
sbatch --dependency=afterany:"$dep" --ntasks=1 --job-name=ibtmpi-report \
       --output="$OUT/report-%j.out" \
       --wrap="$VENV/bin/ibtmpi bench report $OUT/t1-n* --out $OUT/report"
echo "report: $OUT/report/report.md when all runs have ended"
echo "progress: $VENV/bin/ibtmpi status $OUT/t1-n*"

#!/usr/bin/env bash
# Submit one run per N = 1 2 4 8 16 32 (N workers + master), then a job that
# collects them with `ibtmpi bench report` when all have ended.
#   bash slurm/sweep.sh examples/paper25k.toml [TEMPLATE] [--set k=v ...]
# TEMPLATE defaults to slurm/cpu.sbatch (slurm/gpu-node.sbatch for GPUs).
# IBTMPI_SWEEP_NS (default "1 2 4 8 16 32") picks the worker counts;
# IBTMPI_SWEEP_SEEDS=S (default 1) queues each N with S seeds (model.seed =
# data.seed = 0..S-1, as `ibtmpi bench run --seeds`), so the report gives
# mean +- sd per cell; IBTMPI_SWEEP_DIR the output directory.
set -euo pipefail
CONFIG=${1:?usage: slurm/sweep.sh CONFIG.toml [TEMPLATE] [--set k=v ...]}
shift
TEMPLATE=slurm/cpu.sbatch
if [ $# -gt 0 ] && [ -f "$1" ]; then TEMPLATE=$1; shift; fi
OUT=${IBTMPI_SWEEP_DIR:-runs/sweep}
VENV=${IBTMPI_VENV:-$PWD/.venv}
SEEDS=${IBTMPI_SWEEP_SEEDS:-1}
if [[ ! "$SEEDS" =~ ^[0-9]+$ ]] || ((10#$SEEDS < 1)); then
    echo "sweep: IBTMPI_SWEEP_SEEDS must be a whole number >= 1, got '$SEEDS'" >&2
    exit 2
fi
SEEDS=$((10#$SEEDS))
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
    for ((s = 0; s < SEEDS; s++)); do
        algo_args=()
        [ "$n" -eq 1 ] && algo_args=(--set algorithm.name=sgd)
        name="t1-n$n"
        if [ "$s" -gt 0 ]; then                  # seed 0 keeps the config's seeds
            name="$name-s$s"
            algo_args+=(--set model.seed=$s --set data.seed=$s)
        fi
        id=$(sbatch --parsable --ntasks=$((n == 1 ? 1 : n + 1)) --job-name="ibtmpi-n$n" \
             --output="$OUT/$name-%j.out" "$TEMPLATE" "$CONFIG" \
             --set run.dir="$OUT/$name" "${algo_args[@]}" "$@")
        echo "N=$n${name#t1-n$n}: job $id"
        ids+=("$id")
    done
done
dep=$(IFS=:; echo "${ids[*]}")
sbatch --dependency=afterany:"$dep" --ntasks=1 --job-name=ibtmpi-report \
       --output="$OUT/report-%j.out" \
       --wrap="$VENV/bin/ibtmpi bench report $OUT/t1-n* --out $OUT/report"
echo "report: $OUT/report/report.md when all runs have ended"
echo "progress: $VENV/bin/ibtmpi status $OUT/t1-n*"

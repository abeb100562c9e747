#!/usr/bin/env bash
# End to end on one GPU: the training step against PyTorch and the trainer's
# speed over whole passes, for a machine with CUDA, CuPy, PyTorch, mpi4py
# preinstalled and no network. Writes everything under OUTDIR; about 3
# minutes, at most GPU_E2E_BUDGET seconds of stages (330 unless set) and
# the install: within 6 minutes.   bash benchmarks/gpu_e2e.sh OUTDIR
# 1. nvidia-smi, `ibtmpi info`, every kernels/*.cu compiled by CuPy (which
#    also fills CuPy's kernel cache before anything is timed)
# 2. step: the reference CNN's training step (64x64x3) at batch 32, 64 and
#    256, ours vs PyTorch fp32 (TF32 off) and PyTorch's defaults (cuDNN may
#    use TF32), ours also replayed from CUDA graphs, under TF32 GEMMs and
#    both, and the TF32 gradients' deviation from fp32 (gpu_step.txt, .json)
# 3. prep: `ibtmpi prep synth`, 25,000 64x64 images
# 4. the trainer, --device gpu, one process: sgd (N = 1) at batch 32 and at
#    256 (GPU_E2E_PASSES passes each, 20 unless set), ibt --simulate 4 (5
#    passes); then ibt with 2 GPU workers under mpiexec -n 3 (5 passes;
#    skipped, and said so, without an mpiexec whose MPI mpi4py loads).
#    Logs in train.txt; each run's summary.json, metrics.jsonl, config.toml
#    and process_wall_s (its wall time, launch to exit, measured here) in
#    runs/NAME/
# 5. summary: benchmarks/e2e_summary.py writes e2e.txt (and e2e.json): per
#    run img/s over its passes, startup, pass times, final evaluation,
#    data-wait share, whole-run wall against the sum of the passes, the
#    ratios to the step at the same batch, each target beside its figure
# Stages run under their own time limits within the budget as in
# gpu_check.sh (benchmarks/gpu_stages.sh; OUTDIR/stages.txt says how each
# ended); the summary keeps 20 s of the budget for itself.
# GPU_E2E_QUICK=1: tiny sizes, for a rehearsal on a CPU through the CuPy
# stand-in (tests/standin on PYTHONPATH; tests/unit/test_gpu_e2e.py): it
# checks this script, not the GPU.
set -uo pipefail
# begin, stage, install_tree, env_stages, mpi_launcher
. "$(dirname "$0")/gpu_stages.sh"
begin gpu_e2e.sh "$@"
budget=${GPU_E2E_BUDGET:-330} reserve=20   # 20 s kept for the summary

install_tree "$tmp/site"
if [ "${GPU_E2E_QUICK:-0}" = 1 ]; then
    images="--n 300 --size 16 --shards 2" passes=${GPU_E2E_PASSES:-2} few=1
    step="--model tiny --size 16 --batches 8,16,32 --steps 2 --warmup 2" b1=8 b2=32
    model="--set model.layers=tiny --set data.split_size=32"
else
    images="--n 25000 --size 64 --shards 4" passes=${GPU_E2E_PASSES:-20} few=5
    step="" b1=32 b2=256 model=""
fi
env_stages "$out/env.txt"
stage step 120 "$out/gpu_step.txt" python3 benchmarks/bench_gpu_step.py $step --graphs \
    --gpu-math tf32 --no-breakdown --json "$out/gpu_step.json"
data=$tmp/d
stage prep 120 "$out/train.txt" python3 -m ibtmpi prep synth "$data" $images --quiet
mkdir -p "$out/runs"
names=()
# train NAME SECONDS [LAUNCHER...] -- TRAIN ARGS...: one training run in
# $tmp/NAME, its small files and its wall time to runs/NAME
train() {
    local name=$1 secs=$2 launch=()
    shift 2
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    names+=("$name")
    echo "== $name" >>"$out/train.txt"
    stage "train-$name" "$secs" "$out/train.txt" "${launch[@]}" -m ibtmpi train --device gpu \
        --set data.path="$data" $model --set run.dir="$tmp/$name" --set run.quiet=true "$@"
    mkdir -p "$out/runs/$name"
    [ -n "$stage_s" ] && echo "$stage_s" >"$tmp/$name/process_wall_s" 2>/dev/null
    for f in summary.json metrics.jsonl config.toml process_wall_s; do
        cp "$tmp/$name/$f" "$out/runs/$name/" 2>/dev/null
    done
}
one="--set algorithm.name=sgd --set run.passes=$passes"
train sgd-b$b1 90 python3 -- $one --set data.batch=$b1
train sgd-b$b2 60 python3 -- $one --set data.batch=$b2
train ibt-sim4 90 python3 -- --simulate 4 --set run.passes=$few --set data.batch=$b1
if mpi_launcher 3; then
    train ibt-mpi2 90 $mpiexec -n 3 "$py" -- --set run.passes=$few --set data.batch=$b1
else
    echo "train-ibt-mpi2: SKIPPED (no usable mpiexec + mpi4py)" | tee -a "$out/stages.txt"
fi
reserve=0
runs=()
for n in "${names[@]}"; do runs+=("$n=$out/runs/$n"); done
stage summary 20 "$out/summary.log" python3 benchmarks/e2e_summary.py \
    --step "$out/gpu_step.json" --out "$out/e2e.txt" "${runs[@]}"
cat "$out/stages.txt"
ls "$out"      # env, stages, gpu_step (2), train, summary.log, e2e (2), runs/

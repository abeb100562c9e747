#!/usr/bin/env bash
# GPU checks for a single-GPU machine with CUDA, CuPy, PyTorch, mpi4py and
# pytest preinstalled and no network. Writes everything under OUTDIR; about
# 3-5 minutes.   bash benchmarks/gpu_check.sh OUTDIR
# 1. nvidia-smi, `ibtmpi info`; every kernels/*.cu compiled by CuPy on the
#    real toolkit
# 2. the gpu-marked tests: each CuPy launch vs the NumPy reference
# 3. the training step, our kernels vs PyTorch/cuDNN fp32, batch 32, 64 and 256,
#    and where our step's time goes, op by op (gpu_step.txt)
# 4. a short training with 2 workers sharing the GPU (mpiexec -n 3 when an
#    mpiexec exists and mpi4py loads its MPI, else --simulate 2 in one
#    process, which needs no MPI); with a CUDA-aware MPI
#    also run.cuda_aware = off, and z of both modes compared bit for bit;
#    the same one-process GPU run twice, z compared bit for bit; the MPI
#    run's timeline (train_timeline.json: every rank's spans per block);
#    under mpiexec the master's consensus update on its GPU against the
#    host's, z compared bit for bit; the update timed on host and GPU;
#    a run under a GPU memory limit must end with exit 71 and one line
# Every stage runs under its own time limit, so one that hangs costs its
# limit, not the rest, and all of them within GPU_CHECK_BUDGET seconds (450
# unless set: a stage gets what is left, one that would start with under
# 10 s is skipped), so the results are written before an outer limit cuts
# the script off: OUTDIR/stages.txt says how each ended and how long it
# took. Our own package is installed from this tree with --no-deps (or, where
# pip cannot build it without network, laid out by copying): numpy, h5py,
# threadpoolctl, tqdm and pillow must be there (bring wheels if not).
# Rehearsed on a CPU in CI: tests/unit/test_gpu_check.py.
set -uo pipefail
# begin, stage, install_tree, env_stages, mpi_launcher
. "$(dirname "$0")/gpu_stages.sh"
begin gpu_check.sh "$@"
site=$tmp/site
budget=${GPU_CHECK_BUDGET:-450}

# same_z LABEL RUN1 RUN2: are the two runs' consensus models equal bit for bit?
same_z() {
    if [ -f "$2/model.npz" ] && [ -f "$3/model.npz" ]; then
        python3 -c "import numpy as np, sys; a, b = (np.load(f'{d}/model.npz') for d in sys.argv[2:]); \
print(sys.argv[1] + ', z bitwise equal:', a['z'].tobytes() == b['z'].tobytes())" "$@"
    else
        echo "$1: not compared, a run did not finish"
    fi 2>&1 | tee -a "$out/train.txt"
}

install_tree "$site"
# GPU_CHECK_QUICK=1: tiny sizes, for a rehearsal of the stages on a CPU
# through the CuPy stand-in (tests/standin on PYTHONPATH; tests/unit/
# test_gpu_check.py): it checks this script, not the GPU
if [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then
    images="--n 300 --size 16" step="--batches 2,3 --steps 1 --warmup 1"
    cons="--p 20000 --reps 2"
    model="--set model.layers=tiny --set data.batch=16 --set data.split_size=40"
    r8size=16 r18size=16
else
    images="--n 4000 --size 64" step="" model="--set data.split_size=256" cons=""
    r8size=32 r18size=64
fi
env_stages "$out/env.txt"
stage gpu-tests 240 "$out/gpu_tests.txt" \
    python3 -m pytest -m gpu tests/gpu -ra -q -p no:cacheprovider -o addopts=""
# pytest ends 0 when every test skipped (no CuPy, no device): say so
if [ -f "$out/gpu_tests.txt" ] && ! grep -Eq "[0-9]+ passed" "$out/gpu_tests.txt"; then
    echo "gpu-tests: NO TEST PASSED (all skipped? see gpu_tests.txt)" | tee -a "$out/stages.txt"
fi
stage step-vs-cudnn 180 "$out/gpu_step.txt" \
    python3 benchmarks/bench_gpu_step.py $step --json "$out/gpu_step.json"
# the modern CNNs (BatchNorm, residual blocks, GAP): resnet8 at 32x32 and
# resnet18 at 64x64, against PyTorch on the same architecture
stage step-resnet8 120 "$out/gpu_step_resnet8.txt" \
    python3 benchmarks/bench_gpu_step.py $step --model resnet8 --size $r8size --no-breakdown \
    --json "$out/gpu_step_resnet8.json"
stage step-resnet18 180 "$out/gpu_step_resnet18.txt" \
    python3 benchmarks/bench_gpu_step.py $step --model resnet18 --size $r18size \
    --json "$out/gpu_step_resnet18.json"
data=$tmp/d
stage prep 120 "$out/train.txt" python3 -m ibtmpi prep synth "$data" $images --shards 2 --quiet
# the timeline shows where GPU workers spend a block (compute spans carry
# the host CPU seconds: a host thread spinning in a sync shows there)
sets="--set data.path=$data $model --set run.passes=2 --set run.dir=$tmp/run --set run.quiet=true --set run.timeline=true"
if mpi_launcher 3; then
    # run.cuda_aware = auto: the "block buffers:" line says what the MPI
    # library reported and where the workers' buffers went
    stage train-mpi 180 "$out/train.txt" $mpiexec -n 3 "$py" -m ibtmpi train --device gpu $sets
    # the master keeps z on its GPU there (run.master_device = auto): with
    # its update on the host instead z must be the same bit for bit
    sets3="${sets/run.dir=$tmp\/run/run.dir=$tmp/run-master-cpu}"
    stage train-mpi-master-cpu 180 "$out/train.txt" \
        $mpiexec -n 3 "$py" -m ibtmpi train --device gpu $sets3 --set run.master_device=cpu
    same_z "master on its GPU vs on the host" "$tmp/run" "$tmp/run-master-cpu"
    aware=$(timeout 60 python3 -c "from ibtmpi import comm; print(comm.cuda_support()[0])")
    if [ "$aware" = True ]; then
        # both modes: with 2 workers the reduced sums and so z must be bitwise equal
        sets2="${sets/run.dir=$tmp\/run/run.dir=$tmp/run-off}"
        stage train-mpi-cuda-aware-off 180 "$out/train.txt" \
            $mpiexec -n 3 "$py" -m ibtmpi train --device gpu $sets2 --set run.cuda_aware=off
        same_z "cuda_aware on vs off" "$tmp/run" "$tmp/run-off"
    fi
else
    # no mpiexec, or an mpi4py without an MPI library: one process needs none
    echo "no usable mpiexec + mpi4py: 2 workers simulated in one process" | tee -a "$out/train.txt"
    stage train-simulate 180 "$out/train.txt" python3 -m ibtmpi train --device gpu --simulate 2 $sets
fi
# no atomics anywhere: the same GPU run twice must give the same z bit for bit
rep="--set data.path=$data $model --set run.passes=1 --set run.quiet=true"
for i in 1 2; do
    stage "repeat-$i" 120 "$tmp/repeat.log" \
        python3 -m ibtmpi train --device gpu --simulate 2 $rep --set run.dir=$tmp/rep$i >/dev/null
done
same_z "GPU run repeated" "$tmp/rep1" "$tmp/rep2"
tail -n 5 "$tmp/repeat.log" >>"$out/train.txt" 2>/dev/null
# the consensus update per block at the reference CNN's size: on the host
# (the master without a GPU) and on the GPU (GPU workers, and the master
# under run.master_device), z checked bit for bit between them
stage consensus-update 120 "$out/consensus.txt" python3 benchmarks/bench_consensus.py --gpu $cons
# out of GPU memory: a pool limit (CuPy's CUPY_GPU_MEMORY_LIMIT) below what
# training needs must end the run with exit status 71 and one line naming
# the GPU, no traceback
oom_limit=$([ "${GPU_CHECK_QUICK:-0}" = 1 ] && echo 300000 || echo 64000000)
stage out-of-memory 120 "$out/train.txt" env CUPY_GPU_MEMORY_LIMIT=$oom_limit bash -c '
    log=$(python3 -m ibtmpi train --device gpu --simulate 2 "$@" 2>&1); rc=$?
    echo "$log" | tail -n 3
    echo "CUPY_GPU_MEMORY_LIMIT='$oom_limit': exit status $rc (71 expected)"
    [ $rc = 71 ] && echo "$log" | grep -q "out of memory (GPU" \
        && ! echo "$log" | grep -q Traceback' _ $rep --set run.dir=$tmp/oom
cp "$tmp/run/summary.json" "$out/train_summary.json" 2>/dev/null
cp "$tmp/run/timeline.json" "$out/train_timeline.json" 2>/dev/null
cat "$out/stages.txt"
ls "$out"      # at most 8 files: env, stages, gpu_tests, gpu_step (2), train (3)

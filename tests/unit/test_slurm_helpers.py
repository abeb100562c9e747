"""tests/slurm/munge_slurm.sh's submit_started, with sbatch and squeue
stubbed: a template job that ended at MPI start-up on the MPI stack's own
failure (Slurm's PMI2 server reading an address message in pieces, UCX
then unpacking a cut address) is submitted once more and the log says so;
a job that failed otherwise, or started training, is not."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# sbatch stub: job ids 101, 102, ...; job k's output gets line k of FAILS
# ("-" for none); a job without a failure starts training (metrics.jsonl)
STUBS = r'''
sbatch() {
    local n out dir a
    n=$(( $(cat "$T/count" 2>/dev/null || echo 0) + 1 )); echo $n > "$T/count"
    for a in "$@"; do
        case "$a" in --output=*) out=${a#--output=} ;; run.dir=*) dir=${a#run.dir=} ;; esac
    done
    out=${out//%j/$((100 + n))}
    line=$(sed -n "${n}p" "$T/fails")
    if [ "$line" = "-" ] || [ -z "$line" ]; then
        mkdir -p "$dir"; echo '{"block": 0}' > "$dir/metrics.jsonl"
    else
        echo "$line" >> "$out"
    fi
    echo $((100 + n))
}
squeue() { return 0; }          # every job is gone at once
say() { echo "multinode: $*"; }
'''


def _submit(tmp_path, fails):
    (tmp_path / "fails").write_text("\n".join(fails) + "\n")
    script = (f'T={tmp_path}; ROOT={ROOT}; VENV=/nonexistent; NODES=3\n'
              f'. "$ROOT/tests/slurm/munge_slurm.sh"\n{STUBS}\n'
              f'submit_started multinode-srun "$T/job-%j.out" run.toml "$T/run"\n')
    p = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip(), p.stderr


@pytest.mark.parametrize("line", [
    "slurmstepd-node1: error: mpi/pmi2: request not begin with 'cmd='",
    "[1796661554.013488] [node1:2987 :0] address.c:985  UCX  ERROR failed to unpack address, "
    "invalid bandwidth 0.00",
    "MPIDI_UCX_comm_addr_exchange(159): ucx function returned with failed status "
    "(Destination is unreachable)"])
def test_the_mpi_stacks_start_up_failure_is_submitted_once_more(tmp_path, line):
    job, err = _submit(tmp_path, [line, "-"])
    assert job == "102"
    assert "the MPI stack failed to start" in err and "submitting it once more" in err


def test_other_failures_and_a_second_start_up_failure_are_not_retried(tmp_path):
    (tmp_path / "a").mkdir()
    job, err = _submit(tmp_path / "a", ["Traceback (most recent call last):", "-"])
    assert job == "101" and "once more" not in err
    (tmp_path / "b").mkdir()
    line = "slurmstepd-node1: error: mpi/pmi2: request not begin with 'cmd='"
    job, err = _submit(tmp_path / "b", [line, line, "-"])
    assert job == "102" and err.count("once more") == 1        # once, not forever


def test_a_job_that_started_training_is_not_retried(tmp_path):
    job, err = _submit(tmp_path, ["-"])
    assert job == "101" and "once more" not in err

"""The Slurm templates: they keep their progress lines, their srun MPI
plugin follows the venv's MPI, and they ask no long time limit and say
their PMI.
(First found by trying the project from a fresh clone.)"""
import glob
import os

from ibtmpi.cli import main

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


# the templates keep their progress lines
def test_slurm_templates_do_not_pass_quiet():
    for path in glob.glob(os.path.join(ROOT, "slurm", "*.sbatch")):
        for line in open(path):
            if "ibtmpi train" in line:
                assert "--quiet" not in line, (path, line)


# templates that run on a stock cluster with the recommended install
def test_srun_mpi_plugin_follows_the_venvs_mpi(capsys):
    from ibtmpi import launcher
    assert launcher.srun_mpi_plugin("hydra") == "pmi2"
    assert launcher.srun_mpi_plugin("openmpi") == "pmix"
    assert launcher.srun_mpi_plugin("unknown") == "pmi2"
    assert main(["info", "--srun-mpi"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == launcher.srun_mpi_plugin(launcher.flavor(launcher.find_mpiexec()))


def test_templates_ask_no_long_time_limit_and_say_their_pmi():
    import re
    for path in glob.glob(os.path.join(ROOT, "slurm", "*.sbatch")):
        text = open(path).read()
        for t in re.findall(r"^#SBATCH --time=(\S+)", text, re.M):
            h = int(t.split(":")[0]) if ":" in t else 0
            assert h <= 1, (path, t)            # fits a 2-hour partition
        if "srun --mpi" in text:
            assert "pmix}" not in text and "info --srun-mpi" in text, path
            assert 'echo "srun --mpi=$PMI' in text, path

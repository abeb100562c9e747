"""The launcher the demo and `bench run` start: which MPI it belongs to,
and the options Open MPI needs for more ranks than cores and for root."""
import os
import stat
import sys

import pytest

from ibtmpi import launcher

VERSIONS = {
    "openmpi5": "mpiexec (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n",
    "openmpi4": "mpiexec (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n",
    "hydra": "HYDRA build details:\n    Version:                                 4.2.0\n",
    "intel": "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619\n",
    "other": "some launcher 1.0\n",
}


def fake(tmp_path, kind, rc=0):
    p = tmp_path / f"mpiexec-{kind}-{rc}"
    p.write_text(f"#!/bin/sh\ncat <<'EOF'\n{VERSIONS[kind]}EOF\nexit {rc}\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


@pytest.mark.parametrize("kind,want", [("openmpi5", "openmpi"), ("openmpi4", "openmpi"),
                                       ("hydra", "hydra"), ("intel", "hydra"),
                                       ("other", "unknown")])
def test_flavor_from_version_text(tmp_path, kind, want):
    assert launcher.flavor(fake(tmp_path, kind)) == want


def test_flavor_of_a_launcher_that_cannot_run(tmp_path):
    assert launcher.flavor(str(tmp_path / "missing")) == "unknown"


def test_open_mpi_gets_oversubscribe_only_beyond_the_cores(tmp_path):
    m = fake(tmp_path, "openmpi5")
    assert launcher.options(m, 3, cores=2, euid=1000) == ["--oversubscribe"]
    assert launcher.options(m, 2, cores=2, euid=1000) == []
    assert launcher.options(m, 2, cores=2, euid=0) == ["--allow-run-as-root"]
    assert launcher.options(m, 5, cores=4, euid=0) == ["--oversubscribe",
                                                       "--allow-run-as-root"]


@pytest.mark.parametrize("kind", ["hydra", "intel", "other"])
def test_other_launchers_get_nothing(tmp_path, kind):
    assert launcher.options(fake(tmp_path, kind), 64, cores=2, euid=0) == []


def test_command_puts_the_options_after_the_launcher(tmp_path):
    m = fake(tmp_path, "openmpi4")
    cmd = launcher.command(10 ** 6, m)
    assert cmd[0] == m and "--oversubscribe" in cmd[1:]
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)


def test_find_prefers_the_venvs_own(monkeypatch, tmp_path):
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        assert launcher.find_mpiexec() == here
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(launcher.LauncherError, match="no mpiexec found"):
        launcher.find_mpiexec()
    m = tmp_path / "mpirun"
    m.write_text("#!/bin/sh\n")
    m.chmod(0o755)
    assert launcher.find_mpiexec() == str(m)


def test_demo_without_a_launcher_is_one_line_exit_2(monkeypatch, tmp_path, capsys):
    from ibtmpi.cli import main
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    data = tmp_path / "d"
    rc = main(["demo", "--n", "200", "--image-size", "8", "--data", str(data),
               "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no mpiexec found" in err and "Traceback" not in err
    assert not data.exists()            # checked before anything is written


def test_info_names_the_launcher(capsys):
    from ibtmpi.cli import main
    assert main(["info", "--model", "tiny"]) == 0
    line = [l for l in capsys.readouterr().out.splitlines() if l.startswith("launcher: ")]
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(here):
        assert line == [f"launcher: {here} ({launcher.flavor(here)})"]
    else:
        assert len(line) == 1

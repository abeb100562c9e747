"""`ibtmpi prep` onto a full file system: exit 74, one line, nothing left
behind (checked first, and when the disk fills mid-write).
(First found by trying the project from a fresh clone.)"""
import os

import pytest

# prep onto a full file system: exit 74, one line, nothing left behind
@pytest.fixture
def full_fs(tmp_path):
    """A 3 MiB tmpfs (root only); unmounted afterwards."""
    import subprocess
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _prep(argv, patch_free=False):
    """`ibtmpi prep ARGV` in a subprocess; patch_free: the free-space check
    passes, so the disk fills in the middle of the writes."""
    import subprocess
    import sys
    code = ("import sys\nfrom ibtmpi.data_prep import writer\n"
            + ("writer.free_bytes = lambda path: 1 << 50\n" if patch_free else "")
            + "from ibtmpi.data_prep.cli import main\n"
            f"sys.exit(main({argv!r}, prog='ibtmpi prep'))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def _one_line_74(r, mnt):
    assert r.returncode == 74, (r.returncode, r.stderr[-3000:])
    lines = (r.stdout + r.stderr).strip().splitlines()
    assert len(lines) == 1, lines[:20]
    assert "No space left on device" in lines[0] and "run it again" in lines[0]
    assert os.listdir(mnt) == []                     # no partial data set left


@pytest.mark.parametrize("patch_free", [False, True], ids=["checked-first", "mid-write"])
def test_prep_synth_on_a_full_disk(full_fs, patch_free):
    r = _prep(["synth", str(full_fs / "ds"), "--n", "3000", "--size", "32", "--quiet"],
              patch_free)
    _one_line_74(r, full_fs)
    if not patch_free:
        assert "the data set needs about" in r.stderr


@pytest.mark.parametrize("patch_free", [False, True], ids=["checked-first", "mid-write"])
def test_prep_folder_on_a_full_disk(full_fs, tmp_path, patch_free):
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(0)
    for c in ("a", "b"):
        (tmp_path / "src" / c).mkdir(parents=True)
        for i in range(150):
            Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(
                tmp_path / "src" / c / f"{i}.png")
    r = _prep(["folder", str(tmp_path / "src"), str(full_fs / "ds"), "--size", "64",
               "--quiet"], patch_free)
    _one_line_74(r, full_fs)

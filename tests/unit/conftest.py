import pytest


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory):
    """A 600-image 16x16 synthetic dataset with 3 train shards (session-wide)."""
    from ibtmpi.data_prep.prep import prep_synth
    out = str(tmp_path_factory.mktemp("ds") / "synth16")
    prep_synth(out, n=600, size=16, seed=4, shards=3, quiet=True)
    return out


def copy_dataset(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return str(dst)

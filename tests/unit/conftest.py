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


def train_args(data, run_dir, passes=1, **extra):
    """`--set` arguments of a small, quick training run (tiny model, split
    40, batch 16, one thread, quiet); extra: more keys, e.g.
    **{"algorithm.name": "ibt"}."""
    out = []
    for k, v in {"data.path": data, "data.split_size": 40, "data.batch": 16,
                 "model.layers": "tiny", "run.passes": passes, "run.dir": run_dir,
                 "run.threads": 1, "run.quiet": "true", **extra}.items():
        out += ["--set", f"{k}={v}"]
    return out

"""The synthetic generator: determinism, balance, ranges, chunk independence."""
import numpy as np
import pytest

from ibtmpi.data_prep import synth


def test_same_seed_same_bytes_other_seed_differs():
    a, la = synth.generate(300, 32, seed=5)
    b, lb = synth.generate(300, 32, seed=5)
    c, _ = synth.generate(300, 32, seed=6)
    assert a.tobytes() == b.tobytes() and np.array_equal(la, lb)
    assert not np.array_equal(a, c)


def test_images_come_from_per_chunk_seed_streams():
    x, y = synth.generate(600, 16, seed=1)
    for chunk in range(3):
        s = slice(chunk * synth.CHUNK, (chunk + 1) * synth.CHUNK)
        assert np.array_equal(synth.make_chunk(1, chunk, y[s], 16), x[s])


def test_balance_types_and_range():
    x, y = synth.generate(1003, 24, seed=0)
    assert x.dtype == np.uint8 and x.shape == (1003, 24, 24, 3)
    counts = np.bincount(y, minlength=5)
    assert counts.max() - counts.min() <= 1
    assert y.dtype == np.int64
    assert x.std() > 20           # not flat
    assert 40 < x.mean() < 200


def test_class_subset():
    x, y = synth.generate(90, 16, seed=0, classes=("lake", "road", "land"))
    assert set(np.unique(y)) == {0, 1, 2}
    with pytest.raises(ValueError, match="unknown class"):
        synth.generate(10, 16, classes=("forest",))


def test_classes_look_different():
    """Per-class mean colours differ (lakes bluer than green areas etc.)."""
    x, y = synth.generate(1000, 32, seed=2)
    means = np.array([x[y == c].reshape(-1, 3).mean(0) for c in range(5)])
    lake, green = means[3], means[2]
    assert lake[2] - lake[1] > green[2] - green[1]

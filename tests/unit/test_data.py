import numpy as np

from ibtmpi.data import channel_stats, normalize


def test_normalize_matches_formula():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (3, 5, 4, 3), dtype=np.uint8)
    mean, std = np.array([100.0, 120.0, 90.0]), np.array([50.0, 60.0, 40.0])
    out = normalize(x, mean, std)
    ref = ((x.astype(np.float64) - mean) / std).transpose(0, 3, 1, 2)
    assert out.dtype == np.float32 and out.shape == (3, 3, 5, 4)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_channel_stats():
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (50, 4, 4, 3), dtype=np.uint8)
    mean, std = channel_stats(x, chunk=7)
    flat = x.reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(mean, flat.mean(0))
    np.testing.assert_allclose(std, flat.std(0))

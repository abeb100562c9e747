"""WorkerData: prefetch gives the same blocks as direct loads; memory and
disk caches agree; augmentation permutes pixels; each sample once a pass."""
import numpy as np

from ibtmpi.data import normalize
from ibtmpi.dataset import Dataset
from ibtmpi.loader import WorkerData, dihedral
from ibtmpi.schedule import Schedule


def test_blocks_match_direct_reads_and_cover_the_pass(small_dataset):
    d = Dataset(small_dataset)
    tr = d.split("train")
    sched = Schedule(tr.n, 3, 40, 16, seed=1)
    all_rows = tr.read_all()
    labels_seen = []
    for w in range(3):
        mem = WorkerData(tr, sched, w, d.mean, d.std, cache="memory")
        disk = WorkerData(tr, sched, w, d.mean, d.std, cache="disk", prefetch=False)
        for p in range(2):
            for b in range(sched.blocks_per_pass):
                got = mem.block(p, b)          # via the prefetch thread
                ref = disk.block(p, b)
                mbs = sched.minibatches(w, p, b)
                assert len(got) == len(ref) == sched.steps_in_block(b)
                for (x, y), (x2, y2), idx in zip(got, ref, mbs):
                    np.testing.assert_array_equal(x, x2)
                    np.testing.assert_array_equal(
                        x, normalize(all_rows[idx], d.mean, d.std))
                    np.testing.assert_array_equal(y, tr.labels[idx])
                    if p == 0:
                        labels_seen.append(idx)
        mem.close()
        disk.close()
    seen = np.sort(np.concatenate(labels_seen))
    assert np.array_equal(seen, np.arange(tr.n))


def test_dihedral_transforms():
    x = np.arange(2 * 4 * 4 * 3, dtype=np.uint8).reshape(2, 4, 4, 3)
    for t in range(8):
        y = dihedral(x.copy(), np.full(2, t))
        assert sorted(y[0].ravel()) == sorted(x[0].ravel())
        if t == 0:
            assert np.array_equal(y, x)
    y = dihedral(x.copy(), np.array([1, 4]))
    assert np.array_equal(y[0], np.rot90(x[0], 1))
    assert np.array_equal(y[1], x[1][:, ::-1])


def test_augmentation_is_seeded(small_dataset):
    d = Dataset(small_dataset)
    tr = d.split("train")
    sched = Schedule(tr.n, 2, 50, 25)
    a = WorkerData(tr, sched, 1, d.mean, d.std, augment=True, seed=5, prefetch=False)
    b = WorkerData(tr, sched, 1, d.mean, d.std, augment=True, seed=5, prefetch=False)
    c = WorkerData(tr, sched, 1, d.mean, d.std, augment=False, prefetch=False)
    xa, xb, xc = a.load(0, 0)[0][0], b.load(0, 0)[0][0], c.load(0, 0)[0][0]
    np.testing.assert_array_equal(xa, xb)
    assert not np.array_equal(xa, xc)
    np.testing.assert_allclose(np.sort(xa.ravel()), np.sort(xc.ravel()))

"""Bad input is one line and exit 2, before anything is written: seeds out
of range, metrics files with bytes that are not UTF-8, predict's inputs
(a FIFO, a huge image, a model that is not finite)."""
import os

import pytest

from ibtmpi.cli import main
from conftest import train_args


@pytest.mark.parametrize("key,value", [("data.seed", -1), ("model.seed", -1),
                                       ("data.seed", 2**32)])
def test_a_seed_out_of_range_is_one_line_and_writes_nothing(small_dataset, tmp_path, capsys,
                                                             key, value):
    run = tmp_path / "r"
    assert main(["train", "--simulate", "2"] + train_args(small_dataset, run)
                + ["--set", f"{key}={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ibtmpi train: error: {key} must be in 0 .. 2**32 - 1, got {value}"], err
    assert not run.exists()


@pytest.fixture(scope="module")
def finished(small_dataset, tmp_path_factory):
    run = tmp_path_factory.mktemp("fin") / "r"
    assert main(["train", "--simulate", "2"] + train_args(small_dataset, run, passes=2)) == 0
    return run


@pytest.mark.parametrize("junk", [b"\xff\xfe not utf-8\n", b"[1, 2]\n", b'{"block": 9'])
def test_status_and_plot_read_metrics_as_far_as_they_are_whole(finished, tmp_path, capsys,
                                                               junk):
    import shutil
    from ibtmpi.fsutil import read_jsonl
    run = tmp_path / "r"
    shutil.copytree(finished, run)
    whole = read_jsonl(str(run / "metrics.jsonl"))
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(junk + b'{"block": 99}\n')
    assert read_jsonl(str(run / "metrics.jsonl")) == whole
    capsys.readouterr()
    assert main(["status", str(run)]) == 0
    assert "finished" in capsys.readouterr().out
    assert main(["plot", str(run), "--out", str(tmp_path / "p")]) == 0
    assert (tmp_path / "p" / "loss.png").is_file() or any((tmp_path / "p").iterdir())


def _png(path, size=16):
    import numpy as np
    from PIL import Image
    Image.fromarray(np.full((size, size, 3), 90, np.uint8)).save(path)
    return str(path)


def test_predict_refuses_a_fifo_without_blocking_on_it(finished, tmp_path, capsys):
    import threading
    fifo = tmp_path / "x.png"
    os.mkfifo(fifo)
    good = _png(tmp_path / "good.png")
    res = {}
    t = threading.Thread(target=lambda: res.update(rc=main(["predict", str(finished),
                                                            str(fifo), good])), daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "predict blocked on the FIFO"
    assert res["rc"] == 2
    cap = capsys.readouterr()
    assert f"cannot read {fifo}: not a regular file (a FIFO" in cap.err
    assert cap.out.count("good.png") == 1


def test_predict_refuses_an_image_too_large_before_decoding_it(finished, tmp_path, capsys):
    import resource
    import numpy as np
    from PIL import Image
    big = tmp_path / "big.png"
    Image.fromarray(np.zeros((9000, 6000), np.uint8), "L").save(big)   # 54 MP, a small file
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert main(["predict", str(finished), str(big)]) == 2
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    err = capsys.readouterr().err
    assert "6000x9000 pixels (54 MP) is more than the 50 MP ibtmpi reads" in err, err
    assert grew < 100_000, grew                      # KiB: nothing decoded


@pytest.mark.parametrize("what", ["nan", "std0"])
def test_a_model_that_is_not_finite_is_refused_by_every_reader(finished, small_dataset,
                                                               tmp_path, capsys, what):
    import numpy as np
    with np.load(finished / "model.npz") as z:
        arrs = dict(z)
    if what == "nan":
        arrs["z"] = arrs["z"].copy()
        arrs["z"][3] = np.nan
        want = "1 of "
    else:
        arrs["std"] = np.zeros_like(arrs["std"])
        want = "std > 0"
    bad = tmp_path / "model.npz"
    np.savez(bad, **arrs)
    img = _png(tmp_path / "a.png")
    for argv in (["predict", str(bad), img], ["evaluate", str(bad), "--data", small_dataset],
                 ["export", str(bad), "--onnx", str(tmp_path / "m.onnx")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and want in err[0] and "Warning" not in err[0], (argv, err)

#!/usr/bin/env python
"""Does the synthetic set measure what a CNN learns? Test accuracy of a
pixel-linear softmax classifier (best of an lr grid, chosen on val) vs the
reference CNN, both trained single-process with SGD on the same dataset.

Usage: python benchmarks/bench_synth_accuracy.py [--data DIR] [--cnn-epochs 3]
"""
import argparse
import os
import time

from ibtmpi import serial, threads
from ibtmpi.dataset import Dataset
from ibtmpi.model import Model
from ibtmpi.optim import SGD


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data/synth64")
    ap.add_argument("--cnn-epochs", type=int, default=3)
    ap.add_argument("--linear-epochs", type=int, default=10)
    ap.add_argument("--threads", default="auto")
    a = ap.parse_args()
    if not os.path.exists(a.data):
        from ibtmpi.data_prep.prep import prep_synth
        prep_synth(a.data, quiet=True)
    threads.configure(a.threads, ranks_on_node=1)
    ds = Dataset(a.data)
    xtr, ytr = ds.split("train").read_all(), ds.split("train").labels
    xva, yva = ds.split("val").read_all(), ds.split("val").labels
    xte, yte = ds.split("test").read_all(), ds.split("test").labels
    shape = (ds.image_shape[2],) + ds.image_shape[:2]
    res = {}
    best = None
    for lr in (0.0003, 0.001, 0.003):
        m = Model("softmax", shape, ds.n_classes, seed=0)
        opt = SGD(m.params, lr=lr, momentum=0.9, weight_decay=1e-4)
        t0 = time.perf_counter()
        serial.train_epochs(m, opt, xtr, ytr, ds.mean, ds.std, 64, a.linear_epochs)
        _, va = serial.evaluate(m, xva, yva, ds.mean, ds.std)
        print(f"linear lr {lr}: val acc {va:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if best is None or va > best[0]:
            best = (va, lr, serial.evaluate(m, xte, yte, ds.mean, ds.std)[1])
    res["linear"] = best
    m = Model("reference", shape, ds.n_classes, seed=0)
    opt = SGD(m.params, lr=0.02, momentum=0.9, weight_decay=5e-4)
    t0 = time.perf_counter()
    serial.train_epochs(m, opt, xtr, ytr, ds.mean, ds.std, 64, a.cnn_epochs,
                        log=lambda r: print(f"cnn epoch {r['epoch']}: loss {r['train_loss']:.4f} "
                                            f"acc {r['train_acc']:.4f}", flush=True))
    _, va = serial.evaluate(m, xva, yva, ds.mean, ds.std)
    _, te = serial.evaluate(m, xte, yte, ds.mean, ds.std)
    print("\n| model | test accuracy | notes |\n|---|---|---|")
    print(f"| pixel-linear softmax | {res['linear'][2]:.4f} | lr {res['linear'][1]}, "
          f"{a.linear_epochs} epochs, best of 3 lrs on val |")
    print(f"| reference CNN | {te:.4f} | lr 0.02, {a.cnn_epochs} epochs, "
          f"{time.perf_counter() - t0:.0f} s |")
    print(f"(chance {1 / ds.n_classes:.2f}; {len(ytr)} train / {len(yte)} test images "
          f"{ds.image_shape})")


if __name__ == "__main__":
    main()

"""Single-process minibatch SGD: the N = 1 baseline's inner loop.

``train_epochs`` runs plain SGD with momentum over in-memory uint8 images,
reshuffled each epoch by (seed, epoch), and reports per-epoch loss and
accuracy. The MPI trainer reuses ``local_steps`` for a worker's split.
Test: tests/unit/test_model.py::test_training_reaches_accuracy.
"""
from __future__ import annotations

import time

import numpy as np

from .data import normalize


def local_steps(model, opt, x_u8, y, mean, std, batch, order=None,
                on_step=None):
    """One sweep of SGD steps over (x_u8, y) in `order` (default: as stored).

    The last partial batch is dropped, so every step has `batch` samples.
    Returns (mean loss, accuracy, steps) over the steps taken."""
    n = len(y)
    order = np.arange(n) if order is None else order
    xb = np.empty((batch, x_u8.shape[3], x_u8.shape[1], x_u8.shape[2]),
                  model.dtype)
    loss_sum, correct, steps = 0.0, 0, 0
    for s in range(0, n - batch + 1, batch):
        idx = np.sort(order[s:s + batch])
        normalize(x_u8[idx], mean, std, out=xb)
        loss, c = model.loss_and_grad(xb, y[idx])
        opt.step(model.grads)
        loss_sum += loss
        correct += c
        steps += 1
        if on_step is not None:
            on_step(loss)
    return loss_sum / max(steps, 1), correct / max(steps * batch, 1), steps


def evaluate_steps(model, x_u8, y, mean, std, out, batch=256):
    """Generator evaluating over uint8 images batch by batch, yielding after
    each batch (the MPI master polls its Allreduce in between); when done,
    out["loss"] and out["acc"] hold the mean loss and the accuracy."""
    loss_sum, correct = 0.0, 0
    for s in range(0, len(y), batch):
        xb = normalize(x_u8[s:s + batch], mean, std, dtype=model.dtype)
        l, a = model.evaluate(xb, y[s:s + batch], batch)
        loss_sum += l * len(xb)
        correct += round(a * len(xb))
        yield
    out["loss"] = loss_sum / max(len(y), 1)
    out["acc"] = correct / max(len(y), 1)


def evaluate(model, x_u8, y, mean, std, batch=256):
    """(mean loss, accuracy) over uint8 images, no gradient."""
    out = {}
    for _ in evaluate_steps(model, x_u8, y, mean, std, out, batch):
        pass
    return out["loss"], out["acc"]


def train_epochs(model, opt, x_u8, y, mean, std, batch, epochs, seed=0,
                 log=None, on_step=None):
    history = []
    for ep in range(epochs):
        order = np.random.default_rng([seed, ep]).permutation(len(y))
        t0 = time.perf_counter()
        loss, acc, steps = local_steps(model, opt, x_u8, y, mean, std, batch,
                                       order, on_step)
        rec = {"epoch": ep + 1, "train_loss": loss, "train_acc": acc,
               "steps": steps, "seconds": time.perf_counter() - t0}
        history.append(rec)
        if log:
            log(rec)
    return history

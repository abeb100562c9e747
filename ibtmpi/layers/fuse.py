"""The optimisation passes over a layer list, the one place that knows
which layers combine: ``commute_relu_pool`` (relu -> maxpool runs as
maxpool -> relu), ``plan_phase_out`` (the host conv -> 2x2 pool
phase-array fast path) and ``fuse_for_device`` (a GPU's conv bias and
ReLU folded into the max-pool between them). Each gives the same bits as
the plain layer list. Tests: tests/unit/test_model.py (reordering, phase
path), tests/unit/test_launchers_host.py and tests/gpu (the fused path).
"""
from __future__ import annotations

from .activation import ReLU
from .conv import Conv2d
from .pool import MaxPool2d


def _kind(entry):
    return entry.get("type") if isinstance(entry, dict) else entry   # checked later


def commute_relu_pool(spec):
    """relu -> maxpool runs as maxpool -> relu: both are monotone, so the
    outputs and gradients are identical (ReLU's gradient at 0 is 0 in both
    orders), and the ReLU then touches k*k times fewer elements."""
    out = list(spec)
    for i in range(len(out) - 1):
        if _kind(out[i]) == ReLU.kind and _kind(out[i + 1]) == MaxPool2d.kind:
            out[i], out[i + 1] = out[i + 1], out[i]
    return out


def plan_phase_out(layers, shapes):
    """Host fast path (see Conv2d.phase_out): a conv followed by a
    2x2/stride-2 max-pool with an even output hands the pool a phase array;
    the first parameter layer never computes an input gradient, so it gets
    the "quads" order. shapes[i + 1] is layers[i]'s output shape."""
    first = next((l for l in layers if l.param_shapes()), None)
    for layer, nxt, out in zip(layers, layers[1:], shapes[1:]):
        if (isinstance(layer, Conv2d) and isinstance(nxt, MaxPool2d)
                and nxt.k == 2 and nxt.stride == 2 and not nxt.pad
                and out[1] % 2 == 0 and out[2] % 2 == 0):
            layer.phase_out = "quads" if layer is first else "rows"


def fuse_for_device(layers):
    """On a GPU, fold a conv's bias add and a following ReLU into the
    max-pool between them (kernels/pool.cu): conv -> pool -> relu, the
    model's order after commute_relu_pool, then runs as GEMM + one pool
    launch forward and one pool launch backward instead of five launches
    and three passes over the conv's output, with the same bits. Layers
    must be bound (the pool keeps a view of the conv's bias)."""
    for i, layer in enumerate(layers):
        if not isinstance(layer, MaxPool2d):
            continue
        if i > 0 and isinstance(layers[i - 1], Conv2d) and layers[i - 1].has_bias:
            layers[i - 1].bias_in_pool = True
            layer.bias = layers[i - 1].params[1]
        if i + 1 < len(layers) and isinstance(layers[i + 1], ReLU):
            layers[i + 1].fused = True
            layer.relu = True

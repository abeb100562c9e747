"""The layer base class and the layer registry: ``LAYERS`` ({kind: class},
filled by the ``register`` decorator when ibtmpi/layers/__init__.py imports
the layer modules), ``spec_entry`` (one ``model.layers`` entry checked
against the registry: its kind and its keys), ``REQUIRED`` (the default of a
spec key that must be given) and ``he_normal`` / ``he_std`` (the weight
init of the GEMM layers). A layer declares its spec keys, builds itself
from a spec entry, declares its parameter and buffer shapes, draws its own
initial parameters, runs explicit forward/backward over the ops of
ibtmpi/ops/ and describes its own ONNX node(s). Tests:
tests/unit/test_layer_registry.py (a plug-in layer, its buffers and ONNX
node), tests/unit/test_model.py (spec errors, whole-model finite
differences, bitwise init), tests/unit/test_ops.py (the ops' oracles).
"""
from __future__ import annotations

import math

import numpy as np

from .. import ops


class _Required:
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()    # a spec key without a default: the entry must give it

LAYERS: dict = {}         # kind -> Layer subclass; the one list of layer names


def register(cls):
    """Class decorator: adds cls to LAYERS under cls.kind."""
    old = LAYERS.get(cls.kind)
    if old is not None and old is not cls:
        raise ValueError(f"layer kind {cls.kind!r} registered twice: "
                         f"{old.__module__}.{old.__name__} and "
                         f"{cls.__module__}.{cls.__name__}")
    LAYERS[cls.kind] = cls
    return cls


def spec_entry(entry, idx):
    """(layer class, entry as a dict) of model.layers[idx]: a bare name or a
    table with a 'type'; the kind must be registered and every key one the
    class declares."""
    if isinstance(entry, str):
        entry = {"type": entry}
    if not isinstance(entry, dict) or "type" not in entry:
        raise ValueError(f"model.layers[{idx}]: expected a name or a table "
                         f"with a 'type', got {entry!r}")
    kind = entry["type"]
    if kind not in LAYERS:
        raise ValueError(f"model.layers[{idx}]: unknown layer type {kind!r}; "
                         f"known: {', '.join(sorted(LAYERS))}")
    cls = LAYERS[kind]
    extra = set(entry) - set(cls.keys) - {"type"}
    if extra:
        raise ValueError(f"model.layers[{idx}] ({kind}): unknown key(s) "
                         f"{sorted(extra)}; allowed: {sorted(cls.keys)}")
    return cls, entry


class Layer:
    """Base: no parameters, no buffers, shape unchanged. Subclasses define
    ``forward(x, train) -> y`` and ``backward(dy, need_dx) -> dx``, and are
    registered (``@register``) with their ``kind`` and spec ``keys``.

    ``forward`` keeps what ``backward`` needs; both write into the layer's
    own Workspace, so a returned array is valid until the layer's next call.
    Activations are NCHW (see ibtmpi/ops/).
    """

    kind = "layer"
    keys: dict = {}                      # spec key -> default (or REQUIRED)
    param_names = ("weight", "bias")     # names of param_shapes(), for reports
    buffer_names = ()                    # names of buffer_shapes(), for reports

    def __init__(self):
        self.ws = ops.Workspace()
        self.ops = ops          # the NumPy ops, or a GpuOps with the same signatures
        self.params: list[np.ndarray] = []
        self.grads: list[np.ndarray] = []
        self.buffers: list[np.ndarray] = []

    # -- building -----------------------------------------------------------
    @classmethod
    def spec_values(cls, entry, idx):
        """{key: value} of a spec entry, defaults filled in."""
        vals = {}
        for key, default in cls.keys.items():
            if key in entry:
                vals[key] = entry[key]
            elif default is REQUIRED:
                raise ValueError(f"model.layers[{idx}] ({cls.kind}): missing key "
                                 f"{key!r}; give it, e.g. {{type=\"{cls.kind}\", "
                                 f"{key}=...}}")
            else:
                vals[key] = default
        return vals

    @classmethod
    def from_spec(cls, entry, in_shape, n_classes, idx):
        """The layer(s) of spec entry model.layers[idx] (a dict checked by
        spec_entry) for a per-sample input of shape in_shape: a list, so a
        layer can bring the layers it needs before it (linear: a flatten)."""
        cls.spec_values(entry, idx)
        return [cls()]

    # -- shapes and storage -------------------------------------------------
    def param_shapes(self):
        return []

    def buffer_shapes(self):
        """Shapes of non-parameter state (BatchNorm's running statistics):
        views into Model.buffers, not trained, not in the gradient."""
        return []

    def fan_in(self):
        return 1

    def out_shape(self, in_shape):
        return in_shape

    def bind(self, params, grads):
        self.params, self.grads = params, grads

    def bind_buffers(self, buffers):
        self.buffers = buffers

    # -- initial state ------------------------------------------------------
    def init_params(self, rng, dtype):
        """Draw the initial parameters from the model's shared rng (in layer
        order); none here."""

    def init_buffers(self):
        """Set the buffers to their initial values (the model's buffers start
        at zero); none here."""

    def moments(self, bufs):
        """This worker's share of the consensus of its buffers (one array
        per buffer, as bufs), summed over the workers by the block's
        Allreduce; from_moments(sums, n) turns the sums back into the
        buffers every rank sets. Default: the plain average."""
        return list(bufs)

    def from_moments(self, sums, n):
        return [s * np.float32(1.0 / n) for s in sums]

    def seed_rng(self, entropy):
        """Reseed the layer's own generator, if it has one (dropout)."""

    # -- cost and export ----------------------------------------------------
    def flops(self, out_shape):
        """Forward FLOPs per sample of the layer's GEMM (0 without one)."""
        return 0

    def onnx(self, inp, out, i, helper, numpy_helper):
        """(nodes, initializers) computing tensor `out` from tensor `inp`;
        i is the layer's index (names initializers uniquely)."""
        raise RuntimeError(f"ONNX export: no mapping for layer {self.describe()}")

    def _onnx_weights(self, i, numpy_helper):
        """The weight and bias (if any) as initializers W{i}, B{i}."""
        return [numpy_helper.from_array(np.ascontiguousarray(self._host(a)), f"{n}{i}")
                for n, a in zip("WB", self.params)]

    def _host(self, a):
        return a if self.on_host else self.ops.asnumpy(a)

    # -- helpers ------------------------------------------------------------
    @property
    def on_host(self):
        return self.ops is ops

    def _scratch(self, name, shape, dtype, cnhw=False):
        """A reusable host buffer; on a device None (the launchers allocate),
        or a fresh array when the layout matters (cnhw)."""
        if not self.on_host:
            return self.ops.empty4(shape, dtype, True) if cnhw else None
        return ops._buf4(self.ws, name, shape, dtype, cnhw) if cnhw else \
            self.ws.get(name, shape, dtype)

    def describe(self):
        return self.kind


def he_std(layer):
    return math.sqrt(2.0 / layer.fan_in())


def he_normal(layer, rng, dtype):
    """He-normal weight (std sqrt(2/fan_in)), zero bias (if any): drawn on the host in
    float64 for every backend and dtype (the same init everywhere), then
    cast, scaled in the model's dtype and copied to the layer's device."""
    dtype = np.dtype(dtype)
    w, b = layer.params[0], layer.params[1:]
    vals = rng.standard_normal(w.shape, dtype=np.float64).astype(dtype) * \
        dtype.type(he_std(layer))
    w[...] = vals if layer.on_host else layer.ops.asarray(vals)
    for bias in b:
        bias[...] = 0

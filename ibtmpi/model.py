"""A sequential CNN built from a layer list, with ALL parameters in one flat
vector, all gradients in another and all non-parameter buffers in a third.

``Model.params`` (P,) and ``Model.grads`` (P,) are contiguous; each layer
holds views into them (weight then bias, layer by layer), so optimizers,
the consensus algorithms and MPI each see one buffer. ``Model.buffers``
(``n_buffers``,) float32, on the params' device, holds the layers'
non-parameter state (BatchNorm's running mean/variance) as views bound the same way (``Layer.bind_buffers``):
not trained and not in the gradient; the trainer carries it in the block's
ONE packed Allreduce right after the model part, averaged as docs/design.md
section 9 says. Input is NCHW float. The layer kinds, their spec keys and
defaults, how each builds, initialises and exports itself live in the
registry ``ibtmpi.layers.LAYERS``: nothing here names a layer kind. Tests:
tests/unit/test_model.py (flat gradient vs finite differences, determinism,
spec errors, training reaches a stated accuracy),
tests/unit/test_layer_registry.py (a plug-in layer and its buffers).

Layer specs (config ``model.layers``) are dicts or bare names:
``{type="conv", out=32, k=3, stride=1, pad=1}``, ``"relu"``,
``{type="maxpool", k=2, stride=2}`` (``pad=1`` with ``k=3, stride=2``:
torchvision's stem pool), ``{type="avgpool", k=2, stride=2}``,
``"flatten"``, ``{type="linear", out=256}`` (``out`` omitted = number of classes),
``{type="dropout", p=0.5}``, ``{type="batchnorm", momentum=0.1, eps=1e-5}``,
``{type="residual", out=64, stride=2}`` (a basic block), ``"gap"``
(global average pooling). Presets: ``reference`` (the paper-style CNN),
``softmax`` (linear-only softmax regression), ``tiny`` (for tests),
``resnet8`` and ``resnet18`` (BatchNorm, residual blocks, GAP), and
``resnet18_imagenet`` / ``resnet34_imagenet`` (torchvision's, with the
ImageNet stem).
"""
from __future__ import annotations

import numpy as np

from . import ops
from . import ops as _ops
from .layers import commute_relu_pool, fuse_for_device, plan_phase_out, spec_entry
from .settings import SEED_WHY, Key, bad, declare, seed_range

PRESETS = {
    # conv3x3(3->32)+relu+pool2, conv3x3(32->64)+relu+pool2,
    # conv3x3(64->128)+relu+pool2, linear(->256)+relu, linear(256->C)
    "reference": [
        {"type": "conv", "out": 32, "k": 3, "pad": 1}, "relu",
        {"type": "maxpool", "k": 2},
        {"type": "conv", "out": 64, "k": 3, "pad": 1}, "relu",
        {"type": "maxpool", "k": 2},
        {"type": "conv", "out": 128, "k": 3, "pad": 1}, "relu",
        {"type": "maxpool", "k": 2},
        "flatten", {"type": "linear", "out": 256}, "relu",
        {"type": "linear"},
    ],
    "softmax": ["flatten", {"type": "linear"}],
    # stem conv3x3-16 + BN + ReLU, one basic block per stage at 16/32/64
    # channels (strides 1/2/2), global average pool, linear: for 16-64 px
    "resnet8": [
        {"type": "conv", "out": 16, "k": 3, "pad": 1, "bias": False}, "batchnorm",
        "relu",
        {"type": "residual", "out": 16, "stride": 1},
        {"type": "residual", "out": 32, "stride": 2},
        {"type": "residual", "out": 64, "stride": 2},
        "gap", {"type": "linear"},
    ],
    # torchvision's ResNet-18 for small inputs: conv3x3 stem at 64 channels,
    # no stem max-pool, stages [2, 2, 2, 2] at 64/128/256/512, GAP, linear
    "resnet18": [
        {"type": "conv", "out": 64, "k": 3, "pad": 1, "bias": False}, "batchnorm",
        "relu",
    ] + [{"type": "residual", "out": c, "stride": s if j == 0 else 1}
         for c, s in ((64, 1), (128, 2), (256, 2), (512, 2)) for j in range(2)] + [
        "gap", {"type": "linear"},
    ],
    # torchvision's ResNet-18 and ResNet-34 as they are (the ImageNet stem:
    # conv7x7 stride 2 pad 3, BN, ReLU, max-pool 3x3 stride 2 pad 1), for
    # their pretrained weights: stages [2, 2, 2, 2] and [3, 4, 6, 3] at
    # 64/128/256/512, each stage's first block strided with a conv1x1 + BN
    # shortcut, GAP, linear
    "resnet18_imagenet": None, "resnet34_imagenet": None,
    "tiny": [
        {"type": "conv", "out": 4, "k": 3, "pad": 1}, "relu",
        {"type": "maxpool", "k": 2},
        "flatten", {"type": "linear", "out": 8}, "relu",
        {"type": "linear"},
    ],
}


def _imagenet_resnet(blocks):
    stem = [{"type": "conv", "out": 64, "k": 7, "stride": 2, "pad": 3, "bias": False},
            "batchnorm", "relu", {"type": "maxpool", "k": 3, "stride": 2, "pad": 1}]
    return stem + [{"type": "residual", "out": c, "stride": s if j == 0 else 1}
                   for (c, s), n in zip(((64, 1), (128, 2), (256, 2), (512, 2)), blocks)
                   for j in range(n)] + ["gap", {"type": "linear"}]


PRESETS["resnet18_imagenet"] = _imagenet_resnet((2, 2, 2, 2))
PRESETS["resnet34_imagenet"] = _imagenet_resnet((3, 4, 6, 3))


def _layers_setting(value, where):
    if not isinstance(value, (str, list)):
        raise bad(where, "must be a preset name or a list of layers")
    return value


declare(
    "model",
    Key("layers", "reference", "preset name or a list of layer tables",
        parse=_layers_setting),
    Key("seed", 0, "He initialisation", check=seed_range, why=SEED_WHY),
    Key("init", "", "start from a trained model instead: a run directory, its "
        "model.npz or a checkpoint dir", hashed=False),    # only a fresh start reads it
)


def build_layers(spec, input_shape, n_classes):
    """Instantiate layers from a spec list; returns (layers, shapes), with
    shapes[i + 1] the per-sample output shape of layers[i]."""
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ValueError(f"unknown model preset {spec!r}; "
                             f"known: {', '.join(PRESETS)}")
        spec = PRESETS[spec]
    if not isinstance(spec, (list, tuple)) or not spec:
        raise ValueError("model.layers must be a preset name or a non-empty list")
    spec = commute_relu_pool(spec)
    shape = tuple(int(s) for s in input_shape)
    layers, shapes = [], [shape]
    for idx, entry in enumerate(spec):
        cls, e = spec_entry(entry, idx)
        for layer in cls.from_spec(e, shape, n_classes, idx):
            try:
                shape = layer.out_shape(shape)
            except ValueError as err:
                raise ValueError(f"model.layers[{idx}] ({cls.kind}): {err}") from None
            layers.append(layer)
            shapes.append(shape)
    plan_phase_out(layers, shapes)
    if shape != (n_classes,):
        raise ValueError(f"the model's last layer gives {shape}, expected "
                         f"({n_classes},) logits; end with a linear layer")
    return layers, shapes


def _walk(layers):
    """Every layer, a block's children in place of the block."""
    for layer in layers:
        kids = getattr(layer, "children", None)
        if kids:
            yield from _walk(kids)
        else:
            yield layer


def _views(li, names, shapes, off, slices, *flats):
    """Views of consecutive `shapes` from offset `off` on, in each of the
    flat vectors `flats` (one list each); appends (li, name, slice) to
    `slices`; returns (the lists, the offset after them)."""
    views = [[] for _ in flats]
    for j, s in enumerate(shapes):
        n = int(np.prod(s))
        for v, flat in zip(views, flats):
            v.append(flat[off:off + n].reshape(s))
        slices.append((li, names[j] if j < len(names) else f"#{j}", slice(off, off + n)))
        off += n
    return views, off


class Model:
    """Sequential CNN over one flat parameter vector (and one flat buffer
    vector, see the module docstring).

    input_shape: per-sample (C, H, W); n_classes: logits width.
    """

    def __init__(self, spec="reference", input_shape=(3, 64, 64), n_classes=5,
                 dtype=np.float32, seed=0, ops=None):
        """ops: None for the NumPy backend, or a backend.GpuOps (parameters,
        gradients and activations then live on its device)."""
        self.dtype = np.dtype(dtype)
        self.device_ops = ops
        self.graphs = None        # use_graphs: CUDA graphs of the training step
        self.xp = np if ops is None else ops.cp
        if ops is not None and self.dtype != np.float32:
            raise ValueError("the GPU backend is float32 only")
        self.input_shape = tuple(int(s) for s in input_shape)
        self.n_classes = int(n_classes)
        self.spec = spec
        self.layers, self.shapes = build_layers(spec, self.input_shape,
                                                self.n_classes)
        self.size = sum(int(np.prod(s)) for l in self.layers for s in l.param_shapes())
        self.params = self.xp.zeros(self.size, self.dtype)   # (P,)
        self.grads = self.xp.zeros(self.size, self.dtype)    # (P,)
        self.n_buffers = sum(int(np.prod(s)) for l in self.layers
                             for s in l.buffer_shapes())
        self.buffers = self.xp.zeros(self.n_buffers, np.float32)   # (n_buffers,)
        self.slices = []          # (layer index, name, slice) of params, for reporting
        self.buffer_slices = []   # (layer index, name, slice) of buffers
        p_off = b_off = 0
        for li, layer in enumerate(self.layers):
            (pv, gv), p_off = _views(li, layer.param_names, layer.param_shapes(), p_off,
                                     self.slices, self.params, self.grads)
            layer.bind(pv, gv)
            (bv,), b_off = _views(li, layer.buffer_names, layer.buffer_shapes(), b_off,
                                  self.buffer_slices, self.buffers)
            layer.bind_buffers(bv)
            if ops is not None:
                layer.ops = ops
        if ops is not None:
            fuse_for_device(self.layers)
        else:                 # large convs share one column buffer (layers/conv.py)
            shared = _ops.Workspace()
            for layer in _walk(self.layers):
                layer.shared_ws = shared
        self.init(seed)

    # -- parameters ---------------------------------------------------------
    def init(self, seed):
        """Each layer draws its parameters from one generator, in layer order
        (He-normal weights, zero biases: Layer.init_params), resets its
        buffers and reseeds its own generator (dropout); bitwise
        reproducible for a given seed and dtype."""
        rng = np.random.default_rng(seed)
        for layer in self.layers:
            layer.init_params(rng, self.dtype)
            layer.init_buffers()
        for layer in self.layers:
            layer.seed_rng([seed, 1])

    @property
    def head(self):
        """Index in self.layers of the head, the last linear layer (None
        without one)."""
        return max((i for i, l in enumerate(self.layers) if l.kind == "linear"),
                   default=None)

    def head_start(self):
        """Where the head's parameters start in params (the backbone is
        params[:head_start()]; optim.backbone_lr_scale), or None."""
        h = self.head
        return None if h is None else min(sl.start for li, _n, sl in self.slices
                                          if li == h)

    # -- buffers under the consensus (docs/design.md section 9) ----------------------
    def _buffer_views(self, flat):
        """Per layer, the list of views of `flat` (n_buffers,) that are its
        buffers."""
        out = {}
        for li, _name, sl in self.buffer_slices:
            out.setdefault(li, []).append(flat[sl])
        return out

    def buffer_moments(self, out):
        """Add this model's buffer moments (Layer.moments) into out
        (n_buffers,) host float32: a worker's share of the block's sum."""
        if not self.n_buffers:
            return
        host = self.buffers if self.xp is np else self.device_ops.asnumpy(self.buffers)
        views = self._buffer_views(host)
        for li, dst in self._buffer_views(out).items():
            for d, m in zip(dst, self.layers[li].moments(views[li])):
                d += m

    def buffers_from_moments(self, sums, n):
        """The buffers every rank sets (n_buffers,) host float32 from the
        workers' summed moments (Layer.from_moments)."""
        res = np.zeros(self.n_buffers, np.float32)
        views = self._buffer_views(np.asarray(sums, np.float32))
        for li, dst in self._buffer_views(res).items():
            for d, v in zip(dst, self.layers[li].from_moments(views[li], n)):
                d[...] = v
        return res

    def load_buffers(self, flat):
        """Set the buffers from a host (n_buffers,) array."""
        if self.n_buffers:
            self.buffers[...] = flat if self.xp is np else self.device_ops.asarray(flat)

    def set_dropout_seed(self, seed):
        """Reseed the layers' own generators (dropout), per block and worker:
        no RNG state to checkpoint."""
        base = [int(s) for s in np.atleast_1d(seed)]
        for i, layer in enumerate(self.layers):
            layer.seed_rng(base + [i])

    def summary(self):
        lines = []
        width = max([40] + [len(layer.describe()) for layer in self.layers])
        for layer, shape in zip(self.layers, self.shapes[1:]):
            n = sum(int(np.prod(s)) for s in layer.param_shapes())
            lines.append(f"  {layer.describe():<{width}} -> {str(shape):<16} {n:>10,d}")
        lines.append(f"  total parameters: {self.size:,d} "
                     f"({self.size * self.dtype.itemsize / 2**20:.1f} MiB)"
                     + (f"; buffers: {self.n_buffers:,d} (running statistics)"
                        if self.n_buffers else ""))
        lines.append(f"  training FLOPs per sample: "
                     f"{self.train_flops_per_sample() / 1e9:.3f} G (forward + backward)")
        return "\n".join(lines)

    def train_flops_per_sample(self):
        """FLOPs of forward + backward: each GEMM layer (Layer.flops > 0)
        costs its forward FLOPs once more for the weight gradient and once
        more for the input gradient, except the first such layer (no input
        gradient)."""
        fwd = [f for f in (layer.flops(shape)
                           for layer, shape in zip(self.layers, self.shapes[1:])) if f]
        return 3 * sum(fwd) - (fwd[0] if fwd else 0)

    # -- compute ------------------------------------------------------------
    def _check_input(self, x):
        if x.ndim != 4 or tuple(x.shape[1:]) != self.input_shape:
            raise ValueError(f"model expects input (N, {', '.join(map(str, self.input_shape))}),"
                             f" got {tuple(x.shape)}")
        if x.dtype != self.dtype:
            raise TypeError(f"model is {self.dtype}, input is {x.dtype}; "
                            f"convert explicitly")

    def set_input_norm(self, mean, std):
        """The data set's per-channel mean and std, for uint8 (N, H, W, C)
        input: forward then normalises it as data.normalize does (on a
        device with kernels/input.cu after uploading the uint8 bytes)."""
        scale = (1.0 / np.asarray(std, np.float64)).astype(self.dtype)
        shift = (-np.asarray(mean, np.float64) / np.asarray(std, np.float64)).astype(self.dtype)
        self.input_norm = (mean, std, scale, shift)
        if self.device_ops is not None:
            self._norm_d = (self.device_ops.asarray(scale), self.device_ops.asarray(shift))

    def _from_u8(self, x, ids=None):
        if getattr(self, "input_norm", None) is None:
            raise TypeError("uint8 input needs the data's mean and std: set_input_norm")
        if self.device_ops is None:
            from .data import normalize
            if ids is not None:
                from .loader import dihedral
                x = dihedral(np.array(x), np.asarray(ids))
            return normalize(x, self.input_norm[0], self.input_norm[1], dtype=self.dtype)
        return self.device_ops.normalize_u8(x, *self._norm_d, ids=ids)

    def forward(self, x, train=False, ids=None):
        """logits (N, K); valid until the next forward call. x: (N, C, H, W)
        in the model's dtype, or uint8 / uint16 (N, H, W, C) images once
        set_input_norm has been called; ids: with uint8 images, each one's
        dihedral transform 0..7 (loader.dihedral), applied with the
        normalisation."""
        if x.dtype == np.uint8 or x.dtype == np.uint16:
            x = self._from_u8(x, ids)
        if self.xp is not np and isinstance(x, np.ndarray):
            x = self.xp.asarray(x)                  # host batch -> device
        self._check_input(x)
        for layer in self.layers:
            x = layer.forward(x, train)
        return x

    def backward(self, dlogits):
        """Fills self.grads from dlogits (N, K); no input gradient."""
        dy = dlogits
        last = len(self.layers) - 1
        for i in range(last, -1, -1):
            dy = self.layers[i].backward(dy, need_dx=i > 0)

    def loss_and_grad(self, x, labels, ids=None):
        """One forward+backward on a batch; fills self.grads.
        Returns (mean loss, number of correct predictions), read back to
        the host: on a GPU that waits for the step (step_grad does not)."""
        logits = self.forward(x, train=True, ids=ids)
        o = self.device_ops or ops
        y = self.xp.asarray(labels, dtype=np.int64)     # ONE copy for loss, count, grad
        loss, probs = o.softmax_xent_forward(logits, y)
        correct = int((probs.argmax(axis=1) == y).sum())
        self.backward(o.softmax_xent_backward(probs, y))
        return loss, correct

    def new_stats(self, cap):
        """Accumulator of step_grad's loss sum and correct count for
        batches of up to `cap` rows: (2, cap) float64 on the device (one
        slot per row), (2, 1) on the host."""
        if self.graphs is not None:
            return self.graphs.new_stats(cap)
        return self.xp.zeros((2, cap if self.device_ops is not None else 1), np.float64)

    def use_graphs(self, mode, log=None):
        """run.cuda_graphs (gpu_graphs.StepGraphs): a GPU model's steps
        replayed from CUDA graphs, one per batch size; off on the CPU."""
        self.graphs = None
        if self.device_ops is not None and mode != "off":
            from .gpu_graphs import StepGraphs
            self.graphs = StepGraphs(self, mode, log)
        return self.graphs

    def step_grad(self, x, labels, stats, ids=None):
        """One forward+backward on a batch, filling self.grads, with the
        batch's loss sum and correct count added into `stats` (new_stats).
        On a GPU the loss end is one launch (softmax_xent_train) and nothing
        is read back, so the CPU queues the next step's kernels while the
        GPU runs this one; on the CPU it is loss_and_grad."""
        d = self.device_ops
        if d is None:
            loss, correct = self.loss_and_grad(x, labels, ids)
            stats[0, 0] += loss * len(labels)
            stats[1, 0] += correct
            return
        if self.graphs is not None:
            return self.graphs.step(x, labels, stats, ids)
        return self._device_step(x, labels, stats, ids)

    def _device_step(self, x, labels, stats, ids=None):
        d = self.device_ops
        self.backward(d.softmax_xent_train(self.forward(x, train=True, ids=ids), labels,
                                           stats))

    def read_stats(self, stats):
        """(loss sum, correct count) of the steps added into `stats`: one
        reduction and one read on a GPU."""
        s = stats.sum(axis=1)
        s = s if self.device_ops is None else self.device_ops.asnumpy(s)
        return float(s[0]), int(s[1])                # sums of 0s and 1s: exact

    def evaluate(self, x, labels, batch=256):
        """Mean loss and accuracy over (x, labels) in batches, no grads."""
        n = len(labels)
        loss_sum, correct = 0.0, 0
        for s in range(0, n, batch):
            xb, yb = x[s:s + batch], labels[s:s + batch]
            logits = self.forward(xb, train=False)
            loss, probs = (self.device_ops or ops).softmax_xent_forward(logits, yb)
            loss_sum += loss * len(yb)
            correct += int((probs.argmax(axis=1) == self.xp.asarray(yb)).sum())
        return loss_sum / max(n, 1), correct / max(n, 1)

    def predict_proba(self, x, batch=256):
        out = np.empty((len(x), self.n_classes), self.dtype)
        for s in range(0, len(x), batch):
            logits = self.forward(x[s:s + batch], train=False)
            _, p = (self.device_ops or ops).softmax_xent_forward(
                logits, np.zeros(len(logits), np.int64))
            out[s:s + batch] = p if self.xp is np else self.device_ops.asnumpy(p)
        return out

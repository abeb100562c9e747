"""A trained model as a safetensors file: the interchange format of the
field (an 8-byte header length, a JSON header, raw little-endian tensors),
written through the safetensors package's NumPy API (no torch).

Presets with a torchvision twin (resnet18_imagenet, resnet34_imagenet) get
torchvision's state_dict names and shapes, so
``torchvision.models.resnet18(num_classes=C).load_state_dict(
safetensors.torch.load_file(F))`` takes the file as it is: ``conv1.weight``,
``bn1.weight`` / ``bn1.bias`` (BatchNorm's gamma and beta),
``bn1.running_mean`` / ``running_var``, ``bn1.num_batches_tracked`` (ibtmpi
does not count BatchNorm's batches: 0; PyTorch reads it only with
momentum=None), ``layer1.0.conv1.weight`` ... ``layer2.0.downsample.0.weight``
(the strided block's conv1x1 shortcut) and ``downsample.1.*`` (its BN),
``fc.weight``, ``fc.bias``. Every other model gets the names ibtmpi's own
layers report, ``layers.<i>.<name>`` (docs/engine.md). The header's
``__metadata__`` says what the weights expect: ``format`` "pt", and
``ibtmpi``, a JSON object with the layers, the input shape, the class
names and the input normalisation (mean and std per band on the 0..1 scale,
torchvision's Normalize convention).
Tests: tests/unit/test_interchange.py.
"""
from __future__ import annotations

import json

import numpy as np

from .errors import TrainedModelError

# preset -> blocks per stage: torchvision's resnet18 / resnet34
TWINS = {"resnet18_imagenet": (2, 2, 2, 2), "resnet34_imagenet": (3, 4, 6, 3)}
BN = {"gamma": "weight", "beta": "bias", "running_mean": "running_mean",
      "running_var": "running_var"}
BLOCK = {"conv1": "conv1", "bn1": "bn1", "conv2": "conv2", "bn2": "bn2",
         "short_conv": "downsample.0", "short_bn": "downsample.1"}


def _torchvision_name(layer, li, name, blocks, residual_index):
    """Our (layer index, slice name) -> torchvision's key, for a twin."""
    kind = layer.kind
    if kind == "conv" and li == 0:
        return "conv1.weight"
    if kind == "batchnorm" and li == 1:
        return "bn1." + BN[name]
    if kind == "linear":
        return "fc." + name
    if kind == "residual":
        r = residual_index[li]
        stage = next(s for s in range(4) if r < sum(blocks[:s + 1]))
        block = r - sum(blocks[:stage])
        part, _, leaf = name.partition(".")
        leaf = BN.get(leaf, leaf)
        return f"layer{stage + 1}.{block}.{BLOCK[part]}.{leaf}"
    raise TrainedModelError(f"layer {li} ({kind}) has no torchvision name")


def layout(model, layers):
    """[(key, "params" | "buffers", slice, shape, layer index)] of a Model:
    torchvision's names for a twin preset, `layers.<i>.<name>` else."""
    blocks = TWINS.get(layers) if isinstance(layers, str) else None
    residual_index = {li: n for n, li in enumerate(
        i for i, l in enumerate(model.layers) if l.kind == "residual")}
    out = []
    for li, name, sl, where in ([(li, n, sl, "params") for li, n, sl in model.slices]
                                + [(li, n, sl, "buffers")
                                   for li, n, sl in model.buffer_slices]):
        layer = model.layers[li]
        key = (_torchvision_name(layer, li, name, blocks, residual_index) if blocks
               else f"layers.{li}.{name}")
        out.append((key, where, sl, _shape(layer, name, sl), li))
    return out


def state_dict(model, layers):
    """{name: array} of a Model's parameters and buffers (host float32),
    in layout()'s names, with torchvision's int64 num_batches_tracked after
    each BatchNorm's running_var for a twin preset."""
    flats = {"params": np.asarray(model.params, np.float32),
             "buffers": np.asarray(model.buffers, np.float32)}
    twin = isinstance(layers, str) and layers in TWINS
    out = {}
    for key, where, sl, shape, _ in layout(model, layers):
        out[key] = np.ascontiguousarray(flats[where][sl].reshape(shape))
        if twin and key.endswith("running_var"):
            out[key[:-len("running_var")] + "num_batches_tracked"] = np.zeros((), np.int64)
    return out


def load_into(model, layers, path):
    """Copy the tensors of the safetensors file `path` into a host Model
    (its params and buffers) by name; returns (notes, metadata). The head
    (the last linear layer: fc.* for a twin) keeps the model's own
    initialisation where its shape differs (another class count), with a
    note; any other missing, extra or misshapen tensor is a
    TrainedModelError naming it (and both shapes)."""
    try:
        from safetensors import safe_open
    except ImportError:
        raise TrainedModelError("a .safetensors model.init needs the safetensors package: "
                                "pip install 'ibtmpi[safetensors]'") from None
    try:
        with safe_open(path, framework="numpy") as f:
            meta = f.metadata() or {}
            got = {k: f.get_tensor(k) for k in f.keys()}
    except OSError as e:
        raise TrainedModelError(f"{path}: {e.strerror or e}") from None
    except Exception as e:          # a damaged header: the package's own error
        raise TrainedModelError(f"{path}: not a readable safetensors file ({e})") from None
    head = model.head
    entries = layout(model, layers)
    want = {k for k, *_ in entries}
    extra = sorted(k for k in got if k not in want and not k.endswith("num_batches_tracked"))
    missing = [k for k in (k for k, *_ in entries) if k not in got]
    if missing or extra:
        said = (f"missing {missing[0]}" + (f" (and {len(missing) - 1} more)"
                                           if len(missing) > 1 else "")) if missing else ""
        said += ("; " if said and extra else "") + (
            f"unexpected {extra[0]}" + (f" (and {len(extra) - 1} more)" if len(extra) > 1
                                        else "") if extra else "")
        raise TrainedModelError(f"{path} does not fit model.layers = {layers!r}: {said}")
    notes, flats, kept = [], {"params": model.params, "buffers": model.buffers}, []
    for key, where, sl, shape, li in entries:
        a = got[key]
        if tuple(a.shape) != tuple(shape):
            if li == head:
                kept.append(f"{key} {list(a.shape)}")
                continue
            raise TrainedModelError(f"{path}: {key} is {list(a.shape)}, model.layers = "
                                    f"{layers!r} needs {list(shape)}")
        flats[where][sl] = a.astype(np.float32, copy=False).ravel()
    if kept:
        notes.append(f"the head ({', '.join(kept)} in the file) is initialised anew for "
                     f"this data's {model.n_classes} classes")
    return notes, meta


def _shape(layer, name, sl):
    """The slice's tensor shape: the layer's own (or its child's)."""
    shapes = dict(zip(layer.param_names, layer.param_shapes()))
    shapes.update(zip(layer.buffer_names, layer.buffer_shapes()))
    shape = shapes.get(name)
    if shape is None or int(np.prod(shape)) != sl.stop - sl.start:
        return (sl.stop - sl.start,)
    return tuple(shape)


def export(tm, path):
    """Write the trained model `tm` (outputs.Trained) to `path`; returns
    the number of tensors."""
    try:
        from safetensors.numpy import save
    except ImportError:
        raise TrainedModelError("--safetensors needs the safetensors package: pip install "
                                "'ibtmpi[safetensors]' (or safetensors)") from None
    tensors = state_dict(tm.model, tm.layers)
    meta = {"format": "pt", "ibtmpi": json.dumps({
        "layers": tm.layers, "input_shape": list(tm.model.input_shape),
        "classes": tm.classes, "mean": [m / tm.stored_max for m in tm.mean.tolist()],
        "std": [s / tm.stored_max for s in tm.std.tolist()],
        "names": "torchvision" if isinstance(tm.layers, str) and tm.layers in TWINS
        else "ibtmpi"})}
    from .fsutil import replace_file        # never through a planted link
    replace_file(path, save(tensors, metadata=meta))
    return len(tensors)


def import_weights(path, layers, data, out, normalize=None):
    """`ibtmpi import-weights`: an ibtmpi model file (`out`, model.npz's
    format) of `layers` for the data set at `data`, its tensors from the
    safetensors file `path` (load_into: a head of another class count is
    initialised anew). normalize: "dataset", "imagenet", or None for the
    file's own (its metadata's), else "imagenet" for torchvision's names on
    3 bands, else "dataset". Returns (tensors read, the notes)."""
    from .dataset import Dataset
    from .model import Model
    from .outputs import save_model
    ds = Dataset(data)
    h, w, c = ds.image_shape
    try:
        m = Model(layers, (c, h, w), ds.n_classes, seed=0)
    except ValueError as e:
        raise TrainedModelError(f"--layers {layers!r}: {e}") from None
    notes, meta = load_into(m, layers, path)
    if normalize is None:
        info = {}
        try:
            info = json.loads(meta.get("ibtmpi", "{}"))
        except ValueError:
            pass
        if info.get("mean") and info.get("std") and len(info["mean"]) == c:
            normalize = [list(info["mean"]), list(info["std"])]
        else:
            normalize = ("imagenet" if isinstance(layers, str) and layers in TWINS and c == 3
                         else "dataset")
    cfg = {"data": {"normalize": normalize}, "model": {"layers": layers},
           "algorithm": {"name": "imported"}}
    save_model(out, np.asarray(m.params, np.float32), m, ds, cfg,
               np.asarray(m.buffers, np.float32))
    return len(layout(m, layers)), notes, normalize

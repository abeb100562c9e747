"""One image file into stored pixels: RGB through Pillow, or bands through
tifffile (``prep folder --bands``, ``ibtmpi predict``).

``--bands rgb`` (the default) reads every file with Pillow and converts it
to RGB, as before bands existed. ``--bands all`` keeps every band of each
image; ``--bands 4,3,2`` keeps those 1-based bands in that order. Under
either, .tif/.tiff files are read with tifffile (any band count; uint8,
uint16, int16, float32 and the other integer and float types) and other
files with Pillow as RGB, so they have 3 bands.

Layout of a 3-D TIFF array: when the file stores its bands as samples per
pixel (tifffile's axes hold ``S``: ``YXS`` is (H, W, C), ``SYX`` the planar
(C, H, W) that GDAL writes with INTERLEAVE=BAND), that axis is the bands.
Otherwise (bands stacked as pages, or no axes): the first axis is the bands
when it is at most 64 and smaller than both others, else the last one is.
A 2-D array is one band. Each band is resized on its own as a float32
Pillow image (mode "F"), bilinear with reducing_gap 3 like the RGB path;
a file of the target size is not resampled.

Storage: if every image is 8-bit its values are stored as uint8 as they
are (rounded after a resize); if every image is 16-bit unsigned (Sentinel-2
reflectances, 0..10,000 and more) they are stored as uint16 as they are
(``--depth auto``, the default; dataset.json says ``"dtype": "uint16"``), so
one saturated pixel squeezes nothing; otherwise (float, signed, mixed
depths, or ``--depth 8``) each band is mapped linearly from its [min, max]
over all readable images of the data set onto 0..255 uint8, and
dataset.json's ``band_scale`` records the map (source = offset + scale *
stored), which ``ibtmpi predict`` applies to new files. It is a storage
map, not a learned statistic: no stored value is clipped.
Tests: tests/unit/test_prep.py (test_bands_*).
"""
from __future__ import annotations

import os

import numpy as np

IMAGE_EXT = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp", ".gif", ".webp"}
TIFF_EXT = {".tif", ".tiff"}
MAX_PLANAR = 64                  # at most this many bands in a leading band axis


class BandError(ValueError):
    """A --bands choice the tree cannot satisfy, or tifffile missing: fatal."""


def is_tiff(path):
    return os.path.splitext(path)[1].lower() in TIFF_EXT


def parse_bands(text):
    """'rgb', 'all', or a tuple of 1-based band numbers."""
    t = str(text).strip().lower()
    if t in ("rgb", "all"):
        return t
    try:
        idx = tuple(int(p) for p in t.split(","))
    except ValueError:
        idx = ()
    if not idx or min(idx) < 1:
        raise BandError(f"--bands expects rgb, all or 1-based band numbers like "
                        f"4,3,2, got {text!r}")
    return idx


def tifffile():
    try:
        import tifffile as tf
    except ImportError:
        raise BandError("reading TIFF bands needs the tifffile package: "
                        "pip install tifffile") from None
    return tf


MAX_PIXELS = 50_000_000     # per image: a bigger one is a scene to tile, or a bomb


def check_pixels(path, h, w, itemsize=1, bands=3):
    """ValueError where one image is larger than ibtmpi reads (MAX_PIXELS),
    from its header, before anything is decoded: a 450 KB PNG of
    12000x12000 decodes to 430 MB and took 1.2 GB to resize."""
    if h * w > MAX_PIXELS:
        raise ValueError(f"{w}x{h} pixels ({h * w / 1e6:.0f} MP) is more than the "
                         f"{MAX_PIXELS / 1e6:.0f} MP ibtmpi reads in one image (a whole "
                         f"scene, or a decompression bomb): cut it into tiles first")


def load_image(path, size):
    """uint8 (size, size, 3) RGB; raises on unreadable files."""
    from PIL import Image
    with Image.open(path) as im:
        check_pixels(path, im.size[1], im.size[0])
        im.load()
        if im.mode in ("RGBA", "LA", "P"):
            im = im.convert("RGBA")
            bg = Image.new("RGBA", im.size, (0, 0, 0, 255))
            im = Image.alpha_composite(bg, im)
        im = im.convert("RGB")
        if im.size != (size, size):
            im = im.resize((size, size), Image.BILINEAR, reducing_gap=3.0)
        return np.asarray(im, np.uint8)


def band_axis(shape, axes=""):
    """Which axis of a 3-D TIFF array holds the bands (the module's rule)."""
    if len(axes) == 3 and "S" in axes:
        return axes.index("S")
    if shape[0] <= MAX_PLANAR and shape[0] < shape[1] and shape[0] < shape[2]:
        return 0
    return 2


def _tiff_layout(path, shape, axes):
    if len(shape) == 2:
        return None
    if len(shape) == 3:
        return band_axis(shape, axes)
    raise ValueError(f"{path}: a TIFF of shape {tuple(shape)} (axes {axes}); "
                     f"expected (H, W), (H, W, C) or (C, H, W)")


def band_count(path):
    """Bands of one file from its header alone: 3 for Pillow's files."""
    if not is_tiff(path):
        return 3
    with tifffile().TiffFile(path) as t:
        s = t.series[0]
        ax = _tiff_layout(path, s.shape, s.axes)
        return 1 if ax is None else int(s.shape[ax])


def read_tiff(path):
    """(H, W, C) array in the file's own dtype."""
    with tifffile().TiffFile(path) as t:
        s = t.series[0]
        ax = _tiff_layout(path, s.shape, s.axes)
        hw = [n for i, n in enumerate(s.shape) if i != ax][:2] if ax is not None else s.shape
        check_pixels(path, int(hw[0]), int(hw[1]))
        arr = s.asarray()
        ax = _tiff_layout(path, arr.shape, s.axes)
    if arr.dtype.kind not in "uifb":
        raise ValueError(f"{arr.dtype} pixels are not numbers ibtmpi can store")
    return arr[..., None] if ax is None else np.moveaxis(arr, ax, -1)


def resize_bands(x, size):
    """float32 (size, size, C) from (H, W, C): each band through Pillow's
    mode "F", bilinear, reducing_gap 3 (not resampled when already size)."""
    from PIL import Image
    x = np.asarray(x, np.float32)
    if x.shape[:2] == (size, size):
        return np.ascontiguousarray(x)
    out = np.empty((size, size, x.shape[2]), np.float32)
    for c in range(x.shape[2]):
        im = Image.fromarray(np.ascontiguousarray(x[:, :, c]), "F")
        out[:, :, c] = np.asarray(im.resize((size, size), Image.BILINEAR, reducing_gap=3.0))
    return out


def _pick(path, n, bands):
    """Indices (0-based) of the chosen bands of a file with n bands."""
    if bands == "all":
        return list(range(n))
    if max(bands) > n:
        raise BandError(f"{path} has {n} band(s); --bands asks for band {max(bands)}: "
                        f"choose bands every image has")
    return [b - 1 for b in bands]


def image_hw(path, rgb=True):
    """(height, width) of one image from its header alone (Pillow, or
    tifffile for a TIFF read by its bands)."""
    if rgb or not is_tiff(path):
        from PIL import Image
        with Image.open(path) as im:
            return im.size[1], im.size[0]
    with tifffile().TiffFile(path) as t:
        s = t.series[0]
        ax = _tiff_layout(path, s.shape, s.axes)
        hw = [n for i, n in enumerate(s.shape) if i != ax] if ax is not None else s.shape
        return int(hw[0]), int(hw[1])


def size_plan(sizes, size):
    """(the side to store, a note) for a folder import whose images have
    `sizes` {(h, w): count} (from their headers), with --size `size` (None:
    the images' own side, where they all have one square size). ValueError
    where no side can be chosen."""
    def hw(t):
        return f"{t[1]}x{t[0]}"
    if size is None:
        if len(sizes) == 1 and next(iter(sizes))[0] == next(iter(sizes))[1]:
            size = next(iter(sizes))[0]
        elif sizes:
            common = sorted(sizes.items(), key=lambda kv: -kv[1])
            raise ValueError(
                f"the images have {len(sizes)} sizes ("
                + ", ".join(f"{hw(k)}: {v}" for k, v in common[:3])
                + (", ..." if len(common) > 3 else "") + ") or are not square; give "
                f"--size S to store every image as SxS")
        else:
            size = 64                  # none readable: the decode says why
    resized = {k: v for k, v in sizes.items() if k != (size, size)}
    stretched = sum(v for k, v in sizes.items() if k[0] != k[1])
    if not resized:
        note = f"images {size}x{size}, stored as they are"
    else:
        note = (f"resized {sum(resized.values())} image(s) to {size}x{size} (from "
                + ", ".join(f"{hw(k)}: {v}" for k, v in
                            sorted(resized.items(), key=lambda kv: -kv[1])[:3])
                + (", ..." if len(resized) > 3 else "") + ")")
        if stretched:
            note += (f"; {stretched} of them not square, stretched (crop them first "
                     f"to keep their aspect)")
    return size, note


def depth(dtype):
    """A source's bit depth as stored as it is: 8 (uint8), 16 (uint16), or 0
    (anything else: mapped onto 0..255)."""
    return {np.dtype(np.uint8): 8, np.dtype(np.uint16): 16}.get(np.dtype(dtype), 0)


def load_bands(path, size, bands):
    """(pixels (size, size, C), the source's depth()) under a --bands choice
    other than rgb: uint8 from Pillow's RGB, float32 from a TIFF."""
    if not is_tiff(path):
        rgb = load_image(path, size)
        return rgb[..., _pick(path, 3, bands)], 8
    arr = read_tiff(path)
    arr = arr[..., _pick(path, arr.shape[2], bands)]
    if not np.isfinite(arr).all():
        raise ValueError("NaN or infinite pixel values")
    return resize_bands(arr, size), depth(arr.dtype)


def check_band_counts(paths, bands):
    """C, the channel count of the data set; a BandError naming a file when
    the tree cannot give it (mixed counts under all, a band a file lacks).
    Headers only; a file whose header cannot be read is left to decoding."""
    first = None
    for p in paths:
        try:
            n = band_count(p)
        except BandError:
            raise
        except Exception:                   # unreadable: skipped or fatal later
            continue
        if bands != "all":
            _pick(p, n, bands)
        elif first is None:
            first = (p, n)
        elif n != first[1]:
            raise BandError(f"{p} has {n} band(s), {first[0]} has {first[1]}: --bands all "
                            f"needs one band count in the whole tree; choose bands "
                            f"every image has with --bands, e.g. --bands 1,2,3")
    if bands == "all":
        return first[1] if first else 3
    return len(bands)


def band_scale(rows):
    """{offset, scale} per band from an iterable of float32 (k, H, W, C)
    chunks: source = offset + scale * stored spans each band's range."""
    lo = hi = None
    for x in rows:
        x = x.reshape(-1, x.shape[-1])
        lo = x.min(0) if lo is None else np.minimum(lo, x.min(0))
        hi = x.max(0) if hi is None else np.maximum(hi, x.max(0))
    lo, hi = lo.astype(np.float64), hi.astype(np.float64)
    scale = np.where(hi > lo, (hi - lo) / 255.0, 1.0)
    return {"offset": lo.tolist(), "scale": scale.tolist()}


def to_stored(x, scale, dtype=np.uint8):
    """Stored pixels from decoded bands: rounded (scale None: 8-bit sources
    as uint8, 16-bit ones as uint16) or mapped by band_scale's {offset,
    scale} onto 0..255."""
    x = np.asarray(x, np.float64)
    if scale is not None:
        x = (x - np.asarray(scale["offset"])) / np.asarray(scale["scale"])
    return np.clip(np.rint(x), 0, np.iinfo(dtype).max).astype(dtype)


def check_preprocess(pre, c):
    """A model's or data set's {bands, band_scale}, checked against C bands."""
    bands = pre.get("bands", "rgb")
    bands = parse_bands(",".join(map(str, bands)) if isinstance(bands, list) else bands)
    n = 3 if bands == "rgb" else (c if bands == "all" else len(bands))
    sc = pre.get("band_scale")
    if n != c or (sc is not None and not (isinstance(sc, dict) and all(
            isinstance(sc.get(k), list) and len(sc[k]) == c for k in ("offset", "scale")))):
        raise ValueError(f"bands {pre.get('bands')!r} and band_scale do not describe "
                         f"{c} channels")
    dtype = pre.get("dtype", "uint8")
    if dtype not in ("uint8", "uint16") or (dtype == "uint16" and (sc is not None
                                                                  or bands == "rgb")):
        raise ValueError(f"stored dtype {dtype!r} (with band_scale {sc is not None}) is not "
                         f"one prep folder writes")
    return {"bands": bands, "band_scale": sc, "dtype": dtype}


def load_stored(path, size, c, pre):
    """(size, size, c) of one file with a data set's preprocessing
    (check_preprocess's dict), as prep folder stored its images: uint8, or
    uint16 for a set of 16-bit bands."""
    if pre["bands"] == "rgb":
        return load_image(path, size)
    x, d = load_bands(path, size, pre["bands"])
    if x.shape[2] != c:
        raise ValueError(f"{x.shape[2]} band(s), the model takes {c}")
    if pre.get("dtype", "uint8") == "uint16":
        if d != 16:
            raise ValueError("not a 16-bit image, and the model was trained on 16-bit "
                             "bands stored as they are")
        return to_stored(x, None, np.uint16)
    if pre["band_scale"] is None and d != 8:
        raise ValueError("not an 8-bit image, and the model was trained on 8-bit ones")
    return to_stored(x, pre["band_scale"])

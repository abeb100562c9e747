"""Procedural overhead scenes in the source paper's 5 classes.

residential (roof grid along streets, gable shading, shadows), road (road
networks, crossings and curves over varied ground), green area (vegetation
texture, tree clusters, parks), lake (smooth water bodies with irregular
shorelines), land (bare soil, ploughed fields, patches).

Every image gets a random rotation and scale (patterns are analytic in
rotated, scaled coordinates), colour and illumination shifts, haze, blur
and sensor noise; with probability ``distractor_p`` a minor element of
another class is overlaid (a road across a park, a pond between houses, a
few houses on a field) while the label stays the dominant class.

Deterministic: images are made in fixed chunks of CHUNK, each from its own
seed stream (seed, chunk), so the bytes do not depend on how a caller
batches. Vectorised NumPy over the chunk. Tests: tests/unit/test_synth.py.
"""
from __future__ import annotations

import numpy as np

CLASSES = ("residential", "road", "green_area", "lake", "land")
CHUNK = 256
VERSION = 1          # bump when the images a seed produces change


# -- building blocks (all arrays (B, S, S) float32 unless noted) -----------

def _grid(s):
    t = (np.arange(s, dtype=np.float32) + 0.5) / s - 0.5
    return t[None, :, None], t[None, None, :]          # v (rows), u (cols)


def _value_noise(rng, b, s, cells):
    """Smooth noise in [0, 1]: random lattice (cells+1)^2, smoothstep-bilinear."""
    lat = rng.random((b, cells + 1, cells + 1), dtype=np.float32)
    t = (np.arange(s, dtype=np.float32) + 0.5) * (cells / s)
    i0 = np.minimum(t.astype(np.int64), cells - 1)
    f = t - i0
    f = f * f * (3 - 2 * f)
    rows = lat[:, i0] * (1 - f)[None, :, None] + lat[:, i0 + 1] * f[None, :, None]
    return rows[:, :, i0] * (1 - f)[None, None, :] + rows[:, :, i0 + 1] * f[None, None, :]


def _fbm(rng, b, s, cells=(3, 6, 12, 24), gain=0.55):
    out = np.zeros((b, s, s), np.float32)
    amp, tot = 1.0, 0.0
    for c in cells:
        out += amp * _value_noise(rng, b, s, min(c, s))
        tot += amp
        amp *= gain
    return out / tot


_BELOW_ONE = np.nextafter(np.float32(1), np.float32(0))


def _hash2(ix, iy, salt):
    """Per-cell pseudo-random value in [0, 1) from integer cell coordinates."""
    h = np.sin(ix * 12.9898 + iy * 78.233 + salt * 37.719) * 43758.5453
    # a float64 fraction just below 1 rounds to 1.0 in float32: keep it below
    return np.minimum((h - np.floor(h)).astype(np.float32), _BELOW_ONE)


def _frame(rng, b, s, scale_lo=0.8, scale_hi=1.25):
    """Rotated, scaled, shifted coordinates per image: (x, y) each (B, S, S)."""
    v, u = _grid(s)
    th = rng.uniform(0, 2 * np.pi, b).astype(np.float32)[:, None, None]
    sc = rng.uniform(scale_lo, scale_hi, b).astype(np.float32)[:, None, None]
    ox, oy = (rng.uniform(-5, 5, (2, b, 1, 1))).astype(np.float32)
    c, sn = np.cos(th), np.sin(th)
    return (c * u - sn * v) * sc + ox, (sn * u + c * v) * sc + oy


def _mix(img, mask, colour):
    """img (B,S,S,3) <- colour where mask (B,S,S) in [0,1]; colour (B,S,S,3)
    or broadcastable."""
    m = mask[..., None]
    img *= 1 - m
    img += m * colour
    return img


def _rgb(c, b):
    return np.asarray(c, np.float32).reshape(1, 1, 1, 3) * np.ones((b, 1, 1, 1), np.float32)


def _jitter_colour(rng, base, b, amount):
    """(B,1,1,3) colours scattered around base."""
    base = np.asarray(base, np.float32)
    return np.clip(base + rng.normal(0, amount, (b, 1, 1, 3)).astype(np.float32), 0, 1)


def _ground(rng, b, s, kind):
    """Background textures: 'grass', 'soil' or 'mixed'."""
    n = _fbm(rng, b, s)[..., None]
    n2 = _value_noise(rng, b, s, max(2, s // 4))[..., None]
    grass = _jitter_colour(rng, (0.30, 0.45, 0.20), b, 0.05)
    soil = _jitter_colour(rng, (0.55, 0.45, 0.33), b, 0.06)
    if kind == "grass":
        base = grass * (0.75 + 0.5 * n) + 0.05 * (n2 - 0.5)
    elif kind == "soil":
        base = soil * (0.8 + 0.4 * n) + 0.06 * (n2 - 0.5)
    else:
        w = np.clip(_fbm(rng, b, s, (2, 4))[..., None] * 2.2 - 0.6, 0, 1)
        base = (grass * (1 - w) + soil * w) * (0.8 + 0.4 * n)
    return base.astype(np.float32)


# -- elements: each returns (mask (B,S,S) in [0,1], colour (B,S,S,3)) -------

def _houses(rng, b, s, density=1.0, extent=None):
    x, y = _frame(rng, b, s, 0.9, 1.4)
    p = rng.uniform(0.13, 0.22, b).astype(np.float32)[:, None, None]
    m = rng.uniform(0.12, 0.22, b).astype(np.float32)[:, None, None]
    gx, gy = x / p, y / p
    cx, cy = np.floor(gx), np.floor(gy)
    fx, fy = gx - cx, gy - cy
    salt = rng.integers(0, 1000, b)[:, None, None]
    h = _hash2(cx, cy, salt)
    lot = h < 0.9 * density
    roof = lot & (fx > m) & (fx < 1 - m) & (fy > m) & (fy < 1 - m)
    d = 0.07
    shadow = (lot & (fx > m + d) & (fx < 1 - m + d) & (fy > m + d)
              & (fy < 1 - m + d) & ~roof)
    palette = np.array([(0.62, 0.30, 0.22), (0.55, 0.55, 0.57), (0.35, 0.35, 0.38),
                        (0.50, 0.38, 0.28), (0.40, 0.45, 0.55), (0.75, 0.72, 0.68)],
                       np.float32)
    pick = np.minimum((_hash2(cx + 17, cy - 5, salt) * len(palette)).astype(np.int64),
                      len(palette) - 1)
    col = palette[pick]
    gable = np.where(fx < 0.5, 1.12, 0.85).astype(np.float32)[..., None]
    col = col * gable
    street = _jitter_colour(rng, (0.47, 0.47, 0.48), b, 0.04)
    mask = roof.astype(np.float32)
    # streets (the gaps between lots) are drawn with the houses
    st = ((fx < m * 0.6) | (fy < m * 0.6)).astype(np.float32)
    if extent is not None:
        mask *= extent
        st *= extent
        shadow = shadow & (extent > 0.5)
    return mask, col, st, street, shadow.astype(np.float32)


def _road_mask(rng, b, s, n_roads, width=(0.05, 0.11), extent=None):
    v, u = _grid(s)
    mask = np.zeros((b, s, s), np.float32)
    dash = np.zeros((b, s, s), np.float32)
    for r in range(n_roads):
        phi = rng.uniform(0, np.pi, b).astype(np.float32)[:, None, None]
        off = rng.uniform(-0.25, 0.25, b).astype(np.float32)[:, None, None]
        w = rng.uniform(*width, b).astype(np.float32)[:, None, None]
        curve_amp = (rng.random(b) < 0.4) * rng.uniform(0.05, 0.2, b)
        curve_amp = curve_amp.astype(np.float32)[:, None, None]
        freq = rng.uniform(2, 6, b).astype(np.float32)[:, None, None]
        ph = rng.uniform(0, 2 * np.pi, b).astype(np.float32)[:, None, None]
        along = u * np.cos(phi) + v * np.sin(phi)
        across = -u * np.sin(phi) + v * np.cos(phi) - off
        across = across + curve_amp * np.sin(freq * along + ph)
        d = np.abs(across)
        mask = np.maximum(mask, np.clip((w / 2 - d) * s, 0, 1))
        dash = np.maximum(dash, ((d < 0.008) & (np.sin(along * 60) > 0.2)).astype(np.float32))
    if extent is not None:
        mask *= extent
        dash *= extent
    return mask, dash


def _blob(rng, b, s, radius, rough=0.35):
    """Irregular blob: field > 0 inside; returns field (B,S,S)."""
    v, u = _grid(s)
    c = rng.uniform(-0.2, 0.2, (2, b, 1, 1)).astype(np.float32)
    r = np.sqrt((u - c[0]) ** 2 + (v - c[1]) ** 2)
    R = rng.uniform(*radius, b).astype(np.float32)[:, None, None]
    return (R - r) + rough * (_fbm(rng, b, s, (3, 6, 12)) - 0.5)


def _trees(rng, b, s, cover):
    region = _fbm(rng, b, s, (3, 6))
    # per-image threshold so that about `cover` of the area is canopy region
    srt = np.sort(region.reshape(b, -1), axis=1)
    q = ((1 - np.broadcast_to(cover, (b,))) * (s * s - 1)).astype(np.int64)
    thr = srt[np.arange(b), q][:, None, None]
    cells = max(4, s // 3)
    canopy = _value_noise(rng, b, s, cells)
    mask = np.clip((region - thr) * 12, 0, 1) * (canopy > 0.35)
    col = _jitter_colour(rng, (0.13, 0.30, 0.12), b, 0.03) * (0.7 + 0.6 * canopy[..., None])
    return mask.astype(np.float32), col


def _fields(rng, b, s):
    x, y = _frame(rng, b, s, 0.8, 1.3)
    v, u = _grid(s)
    # Split into up to 4 fields by two random lines; each its own furrows.
    a1 = rng.uniform(0, np.pi, b).astype(np.float32)[:, None, None]
    a2 = a1 + np.float32(np.pi / 2) + rng.normal(0, 0.2, (b, 1, 1)).astype(np.float32)
    o1, o2 = rng.uniform(-0.25, 0.25, (2, b, 1, 1)).astype(np.float32)
    side = ((u * np.cos(a1) + v * np.sin(a1) > o1).astype(np.int64) * 2
            + (u * np.cos(a2) + v * np.sin(a2) > o2).astype(np.int64))
    out = np.zeros((b, s, s, 3), np.float32)
    for k in range(4):
        phi = rng.uniform(0, np.pi, b).astype(np.float32)[:, None, None]
        period = rng.uniform(0.03, 0.07, b).astype(np.float32)[:, None, None]
        stripes = 0.5 + 0.5 * np.sin(2 * np.pi * (x * np.cos(phi) + y * np.sin(phi)) / period)
        plain = (rng.random(b) < 0.3)[:, None, None]
        stripes = np.where(plain, 0.5, stripes)
        base = _jitter_colour(rng, (0.56, 0.44, 0.30), b, 0.07)
        colk = base * (0.82 + 0.3 * stripes[..., None])
        out += (side == k)[..., None] * colk
    return out


# -- classes -----------------------------------------------------------------

def _residential(rng, b, s, distract):
    img = _ground(rng, b, s, "grass")
    mask, col, st, street, shadow = _houses(rng, b, s)
    img = _mix(img, st, street)
    img = _mix(img, shadow * 0.55, np.zeros(3, np.float32))
    img = _mix(img, mask, col)
    if distract.any():          # a pond between the houses
        f = _blob(rng, b, s, (0.08, 0.16), 0.15)
        pond = np.clip(f * s / 2, 0, 1) * distract[:, None, None]
        img = _mix(img, pond, _jitter_colour(rng, (0.12, 0.25, 0.35), b, 0.03))
    return img


def _road(rng, b, s, distract):
    img = _ground(rng, b, s, "mixed")
    n = rng.integers(1, 4, b)
    mask = np.zeros((b, s, s), np.float32)
    dash = np.zeros((b, s, s), np.float32)
    for k in range(1, 4):        # 1-3 roads: crossings and parallel roads
        mk, dk = _road_mask(rng, b, s, 1)
        on = (n >= k)[:, None, None]
        mask = np.maximum(mask, mk * on)
        dash = np.maximum(dash, dk * on)
    shoulder = np.clip(_road_mask_dilate(mask) - mask, 0, 1)
    img = _mix(img, shoulder * 0.7, _jitter_colour(rng, (0.62, 0.60, 0.55), b, 0.04))
    asphalt = _jitter_colour(rng, (0.33, 0.33, 0.35), b, 0.05)
    img = _mix(img, mask, asphalt)
    img = _mix(img, dash * mask * 0.8, _rgb((0.9, 0.88, 0.75), b))
    if distract.any():          # a few houses by the road
        hm, hc, _, _, _ = _houses(rng, b, s, density=0.4)
        keep = hm * (1 - np.minimum(1, mask * 3)) * distract[:, None, None]
        keep *= _corner(rng, b, s, 0.3)
        img = _mix(img, keep, hc)
    return img


def _road_mask_dilate(m):
    out = m.copy()
    out[:, 1:] = np.maximum(out[:, 1:], m[:, :-1])
    out[:, :-1] = np.maximum(out[:, :-1], m[:, 1:])
    out[:, :, 1:] = np.maximum(out[:, :, 1:], m[:, :, :-1])
    out[:, :, :-1] = np.maximum(out[:, :, :-1], m[:, :, 1:])
    return out


def _corner(rng, b, s, frac):
    """A mask covering about `frac` of the image on one random side."""
    v, u = _grid(s)
    a = rng.uniform(0, 2 * np.pi, b).astype(np.float32)[:, None, None]
    d = u * np.cos(a) + v * np.sin(a)
    return (d > 0.5 - frac).astype(np.float32)


def _green(rng, b, s, distract):
    img = _ground(rng, b, s, "grass")
    lush = _fbm(rng, b, s, (4, 8, 16, 32))[..., None]
    img = img * (0.8 + 0.4 * lush)
    tm, tc = _trees(rng, b, s, rng.uniform(0.3, 0.75, b))
    img = _mix(img, tm, tc)
    path = (rng.random(b) < 0.3)[:, None, None]
    pm, _ = _road_mask(rng, b, s, 1, width=(0.015, 0.03))
    img = _mix(img, pm * path, _jitter_colour(rng, (0.70, 0.65, 0.55), b, 0.04))
    if distract.any():          # a road crossing the park
        rm, _ = _road_mask(rng, b, s, 1, width=(0.04, 0.07))
        img = _mix(img, rm * distract[:, None, None], _jitter_colour(rng, (0.35, 0.35, 0.37), b, 0.04))
    return img


def _lake(rng, b, s, distract):
    img = _ground(rng, b, s, "mixed")
    f = _blob(rng, b, s, (0.22, 0.45))
    water = np.clip(f * s / 2, 0, 1)
    shore = np.clip((f + 0.04) * s / 2, 0, 1) - water
    img = _mix(img, shore, _jitter_colour(rng, (0.66, 0.62, 0.48), b, 0.04))
    depth = np.clip(f * 3, 0, 1)[..., None]
    deep = _jitter_colour(rng, (0.07, 0.16, 0.26), b, 0.04)
    shallow = _jitter_colour(rng, (0.20, 0.35, 0.40), b, 0.04)
    wcol = shallow * (1 - depth) + deep * depth
    wcol = wcol + 0.02 * (_value_noise(rng, b, s, 4)[..., None] - 0.5)
    img = _mix(img, water, wcol)
    if distract.any():          # trees on the bank
        tm, tc = _trees(rng, b, s, 0.2)
        img = _mix(img, tm * (1 - water) * distract[:, None, None], tc)
    return img


def _land(rng, b, s, distract):
    img = _fields(rng, b, s)
    soil = _ground(rng, b, s, "soil")
    patch = np.clip((_fbm(rng, b, s, (2, 4, 8)) - 0.55) * 8, 0, 1)
    img = _mix(img, patch, soil)
    if distract.any():          # a few houses, or a track
        hm, hc, _, _, shadow = _houses(rng, b, s, density=0.5)
        keep = hm * _corner(rng, b, s, 0.25) * distract[:, None, None]
        img = _mix(img, keep, hc)
    return img


_MAKERS = (_residential, _road, _green, _lake, _land)


def _photometric(rng, img):
    """Illumination gradient, colour gains, haze, blur and sensor noise."""
    b, s = img.shape[:2]
    v, u = _grid(s)
    a = rng.uniform(0, 2 * np.pi, b).astype(np.float32)[:, None, None]
    amp = rng.uniform(0, 0.3, b).astype(np.float32)[:, None, None]
    illum = 1 + amp * (u * np.cos(a) + v * np.sin(a))
    bright = rng.uniform(0.7, 1.3, b).astype(np.float32)[:, None, None]
    gains = rng.uniform(0.85, 1.15, (b, 1, 1, 3)).astype(np.float32)
    img *= (illum * bright)[..., None] * gains
    haze = rng.uniform(0, 0.25, b).astype(np.float32)[:, None, None, None]
    img *= 1 - haze
    img += haze * np.float32(0.7)
    # 3x3 binomial blur, mixed per image
    k = rng.uniform(0, 1, b).astype(np.float32)[:, None, None, None]
    p = np.pad(img, ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")
    bl = (p[:, :-2] + 2 * p[:, 1:-1] + p[:, 2:]) / 4
    bl = (bl[:, :, :-2] + 2 * bl[:, :, 1:-1] + bl[:, :, 2:]) / 4
    img *= 1 - k
    img += k * bl
    sigma = rng.uniform(0.005, 0.04, b).astype(np.float32)[:, None, None, None]
    img += sigma * rng.standard_normal(img.shape, dtype=np.float32)
    return img


def make_chunk(seed, chunk, labels, size, distractor_p=0.3):
    """Images (len(labels), size, size, 3) uint8 for the given class labels,
    from the seed stream (seed, chunk)."""
    rng = np.random.default_rng([seed, chunk])
    b = len(labels)
    img = np.empty((b, size, size, 3), np.float32)
    distract = rng.random(b) < distractor_p
    for c, maker in enumerate(_MAKERS):
        sel = np.flatnonzero(labels == c)
        if len(sel):
            img[sel] = maker(rng, len(sel), size, distract[sel])
    img = _photometric(rng, img)
    return np.clip(img * 255 + 0.5, 0, 255).astype(np.uint8)


def class_indices(classes):
    """Indices into CLASSES for a subset given by names (order kept)."""
    out = []
    for c in classes:
        if c not in CLASSES:
            raise ValueError(f"unknown class {c!r}; known: {', '.join(CLASSES)}")
        out.append(CLASSES.index(c))
    return out


def draw_labels(n, k, seed):
    """Stratified labels 0..k-1 (counts differ by at most 1), seeded order."""
    labels = np.arange(n) % k
    np.random.default_rng([seed, 2**31]).shuffle(labels)
    return labels


def generate(n, size=64, seed=0, classes=CLASSES, distractor_p=0.3,
             progress=None):
    """n images, stratified over `classes` (counts differ by at most 1),
    in a seeded random order. Returns (images uint8 (n, S, S, 3),
    labels int64 (n,) indexing `classes`)."""
    if size < 8:
        raise ValueError(f"image size must be >= 8, got {size}")
    idx = class_indices(classes)
    labels = draw_labels(n, len(idx), seed)
    images = np.empty((n, size, size, 3), np.uint8)
    gen_labels = np.asarray(idx)[labels]       # maker index per image
    for c0 in range(0, n, CHUNK):
        images[c0:c0 + CHUNK] = make_chunk(seed, c0 // CHUNK,
                                           gen_labels[c0:c0 + CHUNK], size,
                                           distractor_p)
        if progress is not None:
            progress(min(CHUNK, n - c0))
    return images, labels.astype(np.int64)

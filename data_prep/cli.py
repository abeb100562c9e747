"""``ibtmpi-prep`` (also ``ibtmpi prep``): synth | folder | inspect.

Bad input exits with status 2 and one line naming the file or option."""
from __future__ import annotations

import argparse
import os
import sys

from ibtmpi.cli import _positive_int as _pos_int

from . import synth


def _prob(t):
    v = float(t)
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {v}")
    return v


def build_parser(prog="ibtmpi-prep"):
    ap = argparse.ArgumentParser(prog=prog, description="Make and check "
                                 "ibtmpi dataset directories (HDF5 shards).")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND")
    p = sub.add_parser("synth", help="procedural 5-class overhead-image set",
                       description="Write the synthetic residential/road/"
                       "green_area/lake/land set: deterministic per seed.")
    p.add_argument("out", help="dataset directory to create")
    p.add_argument("--n", type=_pos_int, default=25000, help="images (default 25000)")
    p.add_argument("--size", type=_pos_int, default=64, help="image side (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--classes", default=",".join(synth.CLASSES),
                   help="comma-separated subset of " + ",".join(synth.CLASSES))
    p.add_argument("--split", default="0.8,0.1,0.1", help="train,val,test fractions")
    p.add_argument("--shards", type=_pos_int, default=4, help="train shard files (default 4)")
    p.add_argument("--distractors", type=_prob, default=0.3,
                   help="probability of a class-mixing distractor (default 0.3)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing directory")
    p.add_argument("--quiet", action="store_true")

    p = sub.add_parser("folder", help="import a class-per-subfolder image tree",
                       description="Import ROOT/<class>/<image> trees (EuroSAT, "
                       "UC Merced, NWPU-RESISC45, AID): jpg/png/tif, RGB, grey "
                       "or RGBA converted to RGB, resized to --size; or, with "
                       "--bands, the bands of multi-band TIFFs (GeoTIFF, e.g. "
                       "EuroSAT's 13 Sentinel-2 bands).",
                       epilog="example: ibtmpi prep folder EuroSAT_MS data/ms13 "
                       "--bands all --size 64")
    p.add_argument("root")
    p.add_argument("out")
    p.add_argument("--size", type=_pos_int, default=None,
                   help="store every image as SIZExSIZE (default: the images' own size, "
                   "where they all have one square size)")
    p.add_argument("--class-map", help="JSON or TOML table: source folder -> target "
                   "class (\"\" or null drops it; folders not listed are dropped)")
    p.add_argument("--split", default="0.8,0.1,0.1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shards", type=_pos_int, default=1)
    p.add_argument("--bands", default="rgb", metavar="rgb|all|B1,B2,...",
                   help="rgb (default): every image read as RGB; all: every band "
                   "of each image; 4,3,2: those 1-based bands in that order. "
                   "Under all or a list, .tif/.tiff files are read with tifffile "
                   "(any band count, 8/16-bit or float), other images as 3 RGB "
                   "bands; 16-bit unsigned bands are stored as uint16 as they are, "
                   "other non-8-bit ones mapped from their range onto 0..255 "
                   "(docs/data.md)")
    p.add_argument("--depth", default="auto", choices=("auto", "8"),
                   help="auto (default): a tree of uint16 bands is stored as uint16; "
                   "8: mapped from each band's range onto 0..255 uint8 (a quarter of "
                   "the float32 bytes to upload instead of a half, and how sets were "
                   "stored before)")
    p.add_argument("--strict", action="store_true", help="an unreadable image is an error")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--quiet", action="store_true")

    p = sub.add_parser("inspect", help="validate a dataset and print a summary")
    p.add_argument("dir")
    return ap


def main(argv=None, prog="ibtmpi-prep"):
    from ibtmpi.dataset import DatasetError
    from .images import parse_bands
    from .prep import inspect, prep_folder, prep_synth
    from .writer import WriteError, parse_ratios
    ap = build_parser(prog)
    a = ap.parse_args(argv)
    if a.cmd is None:
        ap.print_help()
        return 2
    try:
        if a.cmd == "synth":
            classes = [c.strip() for c in a.classes.split(",") if c.strip()]
            synth.class_indices(classes)
            meta, dt = prep_synth(a.out, a.n, a.size, a.seed, classes,
                                  parse_ratios(a.split), a.shards,
                                  a.distractors, a.overwrite, a.quiet)
            if not a.quiet:
                print(f"wrote {a.out}: " + ", ".join(
                    f"{k} {v['n']}" for k, v in meta["splits"].items())
                    + f" images {a.size}x{a.size} in {dt:.1f} s")
        elif a.cmd == "folder":
            meta, bad, dt = prep_folder(a.root, a.out, a.size, a.class_map,
                                        parse_ratios(a.split), a.seed, a.shards,
                                        a.strict, a.overwrite, a.quiet,
                                        parse_bands(a.bands), a.depth)
            if not a.quiet:
                print(f"wrote {a.out}: classes {', '.join(meta['classes'])}; " +
                      ", ".join(f"{k} {v['n']}" for k, v in meta["splits"].items())
                      + f" images of {meta['image_shape'][2]} band(s) in {dt:.1f} s")
            if meta.get("sizes"):           # resized or stretched: said even when quiet
                if not a.quiet or meta["sizes"].startswith("resized"):
                    print(meta["sizes"])
            if bad:                       # a warning: said even when quiet
                print(f"skipped {len(bad)} unreadable file(s):")
                for p, why in bad:
                    print(f"  {p}: {why}")
        else:
            print("\n".join(inspect(a.dir)))
    except (WriteError, DatasetError, ValueError) as e:
        print(f"{prog} {a.cmd}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:      # disk full, quota, an output place that cannot be made
        from ibtmpi.fsutil import os_error_exit
        from .writer import hdf5_files_open
        msg, code = os_error_exit(f"{prog} {a.cmd}", e)
        print(msg, file=sys.stderr)
        if hdf5_files_open():  # the partial data set is gone; HDF5's exit would crash
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        return code
    return 0

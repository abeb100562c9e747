"""Checks of the CUDA sources on machines WITHOUT a GPU (and with one).

* ``compile_ptx(path, arch)``: NVRTC (libnvrtc from the nvidia-cuda-nvrtc
  wheels or the CUDA toolkit, through ctypes: no CuPy, no driver) compiles a
  .cu file to PTX for compute_70/80/90; with ``lib=`` another NVRTC found
  by ``nvrtc_libs`` (CUDA 13, which a current CuPy compiles with, knows
  compute_80/90 but no longer compute_70: ``archs``); ``compile_nvcc``
  does the same with nvcc where the toolkit supports the architecture.
* ``host_module(path)``: the same .cu compiled as C++ with host_emu.h, each
  ``extern "C" __global__`` kernel wrapped in ``emu_<name>(grid, block,
  args...)`` that loops over blocks and threads; loaded with ctypes so
  tests can run a kernel's index arithmetic on the CPU and compare it with
  the NumPy reference.

``python -m ibtmpi.kernelcheck`` compiles every kernel and prints a table.
Tests: tests/unit/test_kernels.py.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from .errors import KernelError
from .kernels import SOURCE_DIR, sources

ARCHS = ("compute_70", "compute_80", "compute_90")
_SIG = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)


# -- NVRTC through ctypes --------------------------------------------------

def nvrtc_libs():
    """{CUDA major version: libnvrtc path} of every NVRTC here: the pip
    wheels' (nvidia-cuda-nvrtc-cu12, nvidia-cuda-nvrtc 13), then the CUDA
    toolkit's; the first found of each version."""
    cands = []
    for p in sys.path:
        cands += sorted(glob.glob(os.path.join(p, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")))
        cands += sorted(glob.glob(os.path.join(p, "nvidia", "cu*", "lib", "libnvrtc.so*")))
    for root in ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"):
        cands += sorted(glob.glob(os.path.join(root, "libnvrtc.so*")))
    found = {}
    for c in cands:
        if "builtins" in c or "alt" in os.path.basename(c):
            continue
        m = re.search(r"\.so\.(\d+)", os.path.basename(c))
        major = int(m.group(1)) if m else int(nvrtc_version(c).split(".")[0])
        found.setdefault(major, c)
    return found


def find_nvrtc():
    """Path of the oldest NVRTC here (it knows the most architectures), or None."""
    libs = nvrtc_libs()
    return libs[min(libs)] if libs else None


def archs(major):
    """The ARCHS an NVRTC of CUDA `major` compiles for (13 dropped compute_70)."""
    return ARCHS if major < 13 else tuple(a for a in ARCHS if a != "compute_70")


_LIBS = {}


def _nvrtc(path=None):
    path = path or find_nvrtc()
    if path is None:
        raise KernelError("libnvrtc not found: pip install nvidia-cuda-nvrtc-cu12")
    if path not in _LIBS:
        lib = ctypes.CDLL(path)
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        _LIBS[path] = lib
    return _LIBS[path]


def nvrtc_version(path=None):
    lib = _nvrtc(path)
    a, b = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
    return f"{a.value}.{b.value}"


def compile_ptx(path, arch="compute_80", lib=None):
    """PTX text of one .cu file for `arch` (with the NVRTC at path `lib`, else
    find_nvrtc's); raises KernelError with the log."""
    lib = _nvrtc(lib)
    src = open(path, "rb").read()
    prog = ctypes.c_void_p()

    def check(rc, what):
        if rc != 0:
            raise KernelError(f"{os.path.basename(path)} [{arch}]: {what}: "
                              f"{lib.nvrtcGetErrorString(rc).decode()}")
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), src,
                                 os.path.basename(path).encode(), 0, None, None),
          "nvrtcCreateProgram")
    opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++14"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    if rc != 0:
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        raise KernelError(f"{os.path.basename(path)} [{arch}] does not compile:\n"
                          f"{log.value.decode(errors='replace')}")
    n = ctypes.c_size_t()
    check(lib.nvrtcGetPTXSize(prog, ctypes.byref(n)), "nvrtcGetPTXSize")
    ptx = ctypes.create_string_buffer(n.value)
    check(lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode()


def compile_nvcc(path, arch="sm_80"):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise KernelError("nvcc not found")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "k.ptx")
        r = subprocess.run([nvcc, "--ptx", f"-arch={arch}", "-o", out, str(path)],
                           capture_output=True, text=True)
        if r.returncode:
            raise KernelError(f"nvcc {os.path.basename(path)} [{arch}]:\n{r.stderr}")
        return open(out).read()


# -- host emulation ------------------------------------------------------------

def signatures(path):
    """[(kernel name, [(ctype text, param name), ...])] of a .cu file."""
    out = []
    for name, params in _SIG.findall(open(path).read()):
        ps = []
        for p in params.split(","):
            p = " ".join(p.split())
            m = re.match(r"(.*?)(\w+)$", p)
            ps.append((m.group(1).strip(), m.group(2)))
        out.append((name, ps))
    return out


_CT = {"float*": ctypes.c_void_p, "double*": ctypes.c_void_p, "unsigned char*": ctypes.c_void_p,
       "unsigned short*": ctypes.c_void_p,
       "long long*": ctypes.c_void_p, "int*": ctypes.c_void_p,
       "int": ctypes.c_int, "long long": ctypes.c_longlong, "float": ctypes.c_float}


def base_type(t):
    """A parameter's type without qualifiers: 'float*', 'long long', ..."""
    base = t.replace("const", "").replace("__restrict__", "").replace(" ", "")
    base = base.replace("unsignedchar", "unsigned char").replace("longlong", "long long")
    base = base.replace("unsignedshort", "unsigned short")
    if base not in _CT:
        raise KernelError(f"host emulation: unsupported parameter type {t!r}")
    return base


def _ctype(t):
    return _CT[base_type(t)]


class HostModule:
    """ctypes view of an emulated .cu: ``mod.name(grid, block, *args)``;
    array arguments are C-contiguous NumPy arrays."""

    def __init__(self, lib, sigs):
        self._lib = lib
        self._sigs = dict(sigs)
        for name, ps in sigs:
            fn = getattr(lib, f"emu_{name}")
            fn.argtypes = [ctypes.c_uint, ctypes.c_uint] + [_ctype(t) for t, _ in ps]
            fn.restype = None

    def params(self, name):
        """[(ctype text, parameter name)] of kernel `name`, as in the .cu."""
        return self._sigs[name]

    def __getattr__(self, name):
        if name.startswith("_") or name not in self._sigs:
            raise AttributeError(name)
        fn = getattr(self._lib, f"emu_{name}")

        def call(grid, block, *args):
            conv = []
            for a in args:
                if isinstance(a, np.ndarray):
                    if not a.flags.c_contiguous:
                        raise KernelError(f"{name}: array arguments must be C-contiguous")
                    conv.append(a.ctypes.data)
                else:
                    conv.append(a)
            fn(grid, block, *conv)
        return call


def host_module(path, cache_dir=None):
    """Compile `path` as C++ with the emulation header; returns HostModule."""
    path = os.path.abspath(path)
    sigs = signatures(path)
    wrappers = []
    for name, ps in sigs:
        decl = ", ".join(f"{t} {n}" for t, n in ps)
        args = ", ".join(n for _, n in ps)
        wrappers.append(
            f'extern "C" void emu_{name}(unsigned emu_gx_, unsigned emu_bx_, {decl}) {{\n'
            f"  gridDim = dim3(emu_gx_); blockDim = dim3(emu_bx_);\n"
            f"  for (unsigned emu_b_ = 0; emu_b_ < emu_gx_; ++emu_b_)\n"
            f"    for (unsigned emu_t_ = 0; emu_t_ < emu_bx_; ++emu_t_) {{\n"
            f"      blockIdx = uint3{{emu_b_, 0, 0}}; threadIdx = uint3{{emu_t_, 0, 0}};\n"
            f"      {name}({args});\n    }}\n}}\n")
    src = (f'#include "{os.path.join(SOURCE_DIR, "host_emu.h")}"\n'
           f'#include "{path}"\n' + "\n".join(wrappers))
    key = hashlib.sha256((src + open(path).read()).encode()).hexdigest()[:16]
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), f"ibtmpi-emu-{os.getuid()}")
    os.makedirs(cache_dir, exist_ok=True)
    so = os.path.join(cache_dir, f"{os.path.basename(path)}-{key}.so")
    if not os.path.exists(so):
        cpp = f"{so[:-3]}.{os.getpid()}.cpp"      # ranks may build the same module
        with open(cpp, "w") as f:
            f.write(src)
        cxx = os.environ.get("CXX", "g++")
        tmp = f"{so}.{os.getpid()}"
        r = subprocess.run([cxx, "-std=c++17", "-O2", "-ffp-contract=off", "-shared",
                            "-fPIC", "-o", tmp, cpp], capture_output=True, text=True)
        if r.returncode:
            raise KernelError(f"host build of {os.path.basename(path)} failed:\n{r.stderr}")
        os.replace(tmp, so)
        os.unlink(cpp)
    return HostModule(ctypes.CDLL(so), sigs)


def main():
    libs = nvrtc_libs()
    if not libs:
        _nvrtc()                                   # raises: how to get one
    ok = True
    for major, lib in sorted(libs.items()):
        print(f"NVRTC {nvrtc_version(lib)} ({lib})")
        for src in sources():
            row = [os.path.basename(src)]
            for arch in archs(major):
                try:
                    ptx = compile_ptx(src, arch, lib)
                    row.append(f"{arch}: {ptx.count('.entry')} kernels")
                except KernelError as e:
                    ok = False
                    row.append(f"{arch}: FAILED")
                    print(e, file=sys.stderr)
            print("  ".join(row))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

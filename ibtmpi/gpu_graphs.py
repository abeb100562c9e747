"""A GPU worker's training step as a CUDA graph (run.cuda_graphs), and the
GEMMs' math mode (run.gpu_math).

With static shapes a local step issues the same ~40 launches every
minibatch (forward, backward, the loss end; benchmarks/bench_gpu_host.py
measures the Python that issues them). StepGraphs runs the first step of a
batch size as usual (it loads the kernels, creates cuBLAS' handle and
sizes the caches), captures the second with CuPy's stream capture and
from then on copies the batch into the graph's input buffers and launches
the graph: one launch instead of ~40, bitwise the same step (the same
kernels with the same arguments). The optimizer's update stays outside:
its learning rate and step count change between steps, and it is one
fused launch anyway.

What a graph needs and gets here:
- fixed addresses: the inputs are copied into buffers made for the graph;
  the parameters, gradients and buffers are the model's flat vectors
  (written in place); the loss/hit accumulator is one per batch cap
  (``stats``), zeroed per block (Model.new_stats), not a new array;
- its scratch memory: arrays made during the capture come from a pool of
  its own (never handed to work outside the graphs, so nothing else can
  write into memory a graph uses); graphs of different batch sizes share
  it, which is safe because they run one after another on one stream and
  keep nothing between launches;
- no host synchronisation inside the step (the step reads nothing back).

run.cuda_graphs = auto uses graphs on GPU workers and falls back to
ordinary launches (one log line) if a capture fails; on insists; off never.
Tests: tests/unit/test_gpu_pipeline.py (the CuPy stand-in records and
replays its launch list: bitwise equal runs, launch counts, poisoned
results if host code read one during a capture).
"""
from __future__ import annotations

import numpy as np

MODES = ("auto", "on", "off")
MATH = ("fp32", "tf32")


def _linalg(cp):
    core = getattr(cp, "_core", None)
    mod = getattr(core, "_routines_linalg", None) if core is not None else None
    if mod is None:
        import importlib
        mod = importlib.import_module("cupy._core._routines_linalg")
    return mod


def set_gpu_math(cp, math):
    """run.gpu_math: fp32 (cuBLAS' full float32 GEMMs) or tf32 (its TF32
    tensor-core mode for float32 GEMMs: inputs rounded to 10 mantissa bits,
    float32 accumulation). CuPy's compute type is per process and applies
    to every float32 matmul after this call. Our own kernels are float32
    either way."""
    if math not in MATH:
        raise ValueError(f"run.gpu_math must be fp32 or tf32, got {math!r}")
    lin = _linalg(cp)
    lin.set_compute_type(np.float32, lin.COMPUTE_TYPE_TF32 if math == "tf32"
                         else lin.COMPUTE_TYPE_DEFAULT)


class _Graph:
    __slots__ = ("graph", "x", "y", "ids", "stats")

    def __init__(self, graph, x, y, ids, stats):
        self.graph, self.x, self.y, self.ids, self.stats = graph, x, y, ids, stats


class StepGraphs:
    def __init__(self, model, mode="auto", log=None):
        if mode not in MODES:
            raise ValueError(f"run.cuda_graphs must be auto, on or off, got {mode!r}")
        self.model, self.mode, self.log = model, mode, log
        self.cp = cp = model.device_ops.cp
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.pool = cp.cuda.MemoryPool()
        self.graphs = {}             # (n, input dtype, augmented) -> _Graph
        self.seen = set()
        self._stats = {}             # cap -> the (2, cap) accumulator graphs add into
        self.captures = self.replays = 0
        self.off = False

    def pool_bytes(self):
        """Device memory the graphs' own pool holds (their scratch)."""
        return int(self.pool.total_bytes())

    def new_stats(self, cap):
        """The block's accumulator: one per cap, zeroed (a graph holds its
        address)."""
        s = self._stats.get(cap)
        if s is None:
            s = self._stats[cap] = self.cp.zeros((2, cap), np.float64)
        else:
            s.fill(0)
        return s

    def step(self, x, labels, stats, ids=None):
        m = self.model
        key = (len(labels), np.dtype(x.dtype).str, ids is not None)
        if self.off or stats is not self._stats.get(stats.shape[1]):
            return m._device_step(x, labels, stats, ids)
        g = self.graphs.get(key)
        if g is None:
            if key not in self.seen:             # warm-up: an ordinary step
                self.seen.add(key)
                return m._device_step(x, labels, stats, ids)
            g = self._capture(x, labels, stats, ids, key)
            if g is None:
                return m._device_step(x, labels, stats, ids)
        self._put(g.x, x)
        self._put(g.y, labels)
        if ids is not None:
            self._put(g.ids, ids)
        g.graph.launch(stream=self.cp.cuda.get_current_stream())
        self.replays += 1
        return None

    def _put(self, dst, src):
        if isinstance(src, self.cp.ndarray):
            dst[...] = src                       # device -> device, on the current stream
        else:
            dst.set(np.ascontiguousarray(src, dtype=dst.dtype))

    def _capture(self, x, labels, stats, ids, key):
        cp = self.cp
        xs = cp.empty(x.shape, x.dtype)
        ys = cp.empty(len(labels), np.int64)
        ids_s = cp.empty(len(ids), np.int32) if ids is not None else None
        try:
            with cp.cuda.using_allocator(self.pool.malloc), self.stream:
                self.stream.begin_capture()
                try:
                    self.model._device_step(xs, ys, stats, ids_s)
                finally:
                    graph = self.stream.end_capture()
        except Exception as e:                   # noqa: BLE001 (CUDA's reasons vary)
            if self.mode == "on":
                raise RuntimeError(f"run.cuda_graphs = on, but the step could not be "
                                   f"captured: {e}") from e
            self.off = True
            if self.log:
                self.log(f"CUDA graphs off (run.cuda_graphs = auto): the step could not be "
                         f"captured ({type(e).__name__}: {e}); ordinary launches from here")
            return None
        self.captures += 1
        g = self.graphs[key] = _Graph(graph, xs, ys, ids_s, stats)
        return g

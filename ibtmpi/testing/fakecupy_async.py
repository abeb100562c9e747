"""Streams, events, stream capture and CUDA graphs for the CuPy stand-in
(fakecupy.py), modelled strictly enough that ordering mistakes show:

- A stream made with ``cupy.cuda.Stream()`` is lazy: what is issued to it
  (``ndarray.set(host, stream=s)``, kernels while it is current, a graph
  launched on it) is queued, and runs only when an event recorded after it
  is waited on (``wait_event``, ``Event.synchronize``) or the stream is
  synchronized. A copy from pinned host memory therefore reads the host
  buffer when it runs, as a DMA does: overwrite the buffer too early and
  the device gets the new bytes; read the device array without waiting and
  it still holds what was there (a missing wait gives wrong numbers, not
  luck). The null stream (the default) runs at once.
- ``begin_capture``/``end_capture`` (per thread, as CuPy's current stream and
  a relaxed-mode capture are) record instead of running: every
  kernel, GEMM, copy, fill and CuPy elementwise/reduction issued while the
  capturing stream is current becomes a step of the graph; arrays made
  during the capture hold poison (NaN, or 0xAB bytes) until the graph runs,
  so host code that reads a captured result sees it. Work issued to
  another stream, a host -> device copy from pageable memory and any read
  back to the host during a capture raise, as on a GPU.
- ``Graph.launch(stream)`` runs the recorded steps in order (on a lazy
  stream: queued as one item); LAUNCHES["graph launch"] counts launches.
"""
import collections
import threading

import numpy as np

LAUNCHES = collections.Counter()   # kernel name -> launches (fakecupy.LAUNCHES)

_TLS = threading.local()   # CuPy's current stream is per thread, and so is a
                           # capture (relaxed mode: other threads may sync)


def _stack():
    if not hasattr(_TLS, "current"):
        _TLS.current, _TLS.capture = [], None
    return _TLS.current


def current():
    """The stream made current by `with stream:` in this thread, if any."""
    st = _stack()
    return st[-1] if st else None


def capturing():
    """The stream this thread is capturing, if any."""
    _stack()
    return _TLS.capture


def poison(a):
    """Fill a freshly made array (a result not computed yet)."""
    base = a.view(np.ndarray)
    if base.dtype.kind == "f":
        base.fill(np.nan)
    else:
        base.view(np.uint8).fill(0xAB)
    return a


def issue(fn, what):
    """Run fn now, queue it on the current lazy stream, or record it into
    the capture. Returns True when fn ran now."""
    cap = capturing()
    if cap is not None:
        if current() is not cap:
            raise RuntimeError(f"{what} issued to another stream while a stream is capturing "
                               f"(CUDA: operation not permitted when stream is capturing)")
        cap.recorded.append(fn)
        return False
    s = current()
    if s is not None:
        with s.lock:
            s.queue.append(fn)
        return False
    fn()
    return True


def no_capture(what):
    if capturing() is not None:
        raise RuntimeError(f"{what} during stream capture: a synchronous transfer is not "
                           f"allowed while a stream is capturing")


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.stream, self.mark = None, 0

    def record(self, stream=None):
        s = stream if stream is not None else current()
        self.stream, self.mark = s, (s.issued() if s is not None else 0)

    def synchronize(self):
        no_capture("Event.synchronize")
        if self.stream is not None:
            self.stream.flush(self.mark)

    def query(self):
        return self.stream is None or self.stream.done >= self.mark


class Stream:
    """cupy.cuda.Stream, lazy (see the module's docstring)."""
    null = None

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None, log=None):
        self.queue, self.done, self.recorded = [], 0, None
        self.lock = threading.RLock()       # the loader's thread waits on its events
        self.non_blocking = non_blocking
        self.log = log if log is not None else []

    def issued(self):
        with self.lock:
            return self.done + len(self.queue)

    def flush(self, upto=None):
        with self.lock:
            upto = self.issued() if upto is None else upto
            while self.done < upto and self.queue:
                fn = self.queue.pop(0)
                fn()
                self.done += 1

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().pop()
        return False

    def synchronize(self):
        no_capture("Stream.synchronize")
        self.log.append("sync")
        self.flush()

    def record(self, event=None):
        event = event if event is not None else Event()
        event.record(self)
        return event

    def wait_event(self, event):
        """Later work on this stream runs after the event: the stand-in runs
        the event's stream up to it now (earlier than a GPU would: never
        wrong, and a missing wait still shows)."""
        if event.stream is not None and event.stream is not self:
            event.stream.flush(event.mark)

    def begin_capture(self, mode=None):
        if capturing() is not None:
            raise RuntimeError("a stream is already capturing")
        if not self.non_blocking:
            raise RuntimeError("capture on a blocking stream would sync with the legacy stream")
        self.flush()
        self.recorded = []
        _TLS.capture = self

    def end_capture(self):
        if capturing() is not self:
            raise RuntimeError("end_capture on a stream that is not capturing")
        _TLS.capture = None
        steps, self.recorded = self.recorded, None
        return Graph(steps)

    def is_capturing(self):
        return capturing() is self


class Graph:
    def __init__(self, steps):
        self.steps = steps

    def launch(self, stream=None):
        no_capture("Graph.launch")
        LAUNCHES["graph launch"] += 1
        s = stream if stream is not None else current()

        def run():
            for fn in self.steps:
                fn()
        if isinstance(s, Stream):                 # lazy; else the null stream
            with s.lock:
                s.queue.append(run)
        else:
            run()


class ComputeTypes:
    """cupy._core._routines_linalg's float32 compute type: TF32 rounds the
    GEMM's float32 inputs to TF32 (10 mantissa bits, nearest even), which
    the stand-in's matmul then applies."""
    COMPUTE_TYPE_TBD, COMPUTE_TYPE_DEFAULT, COMPUTE_TYPE_TF32 = 0, 1, 7

    def __init__(self):
        self.types = {}

    def set_compute_type(self, dtype, compute_type):
        self.types[np.dtype(dtype).char] = compute_type

    def get_compute_type(self, dtype):
        return self.types.get(np.dtype(dtype).char, self.COMPUTE_TYPE_DEFAULT)

    def tf32(self):
        return self.get_compute_type(np.float32) == self.COMPUTE_TYPE_TF32


def to_tf32(a):
    """float32 -> the nearest TF32 value (1 sign, 8 exponent, 10 mantissa bits)."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32)
    lsb = (b >> 13) & 1
    r = ((b + np.uint32(0x0FFF) + lsb) & np.uint32(0xFFFFE000)).astype(np.uint32)
    return r.view(np.float32)

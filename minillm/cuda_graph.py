"""CUDA graphs: a step's kernels recorded once and replayed with one launch, and the kernels one
call issues, counted by the driver. A GPU's decode step of a small model waits on its launches
(~180 kernels of a few µs each for GPT-2 small), not on its bytes: a graph removes the waiting.

    Captured(fn, device)       fn captured once as a CUDA graph, replayed with `.replay()`
    count_launches(fn, device) the kernels one call of fn issues, counted from a capture of it

The static decode step (engine/static.py) is what gets captured; lessons and benchmarks count and
time it. Needs CuPy and the CUDA driver (libcuda): on the CPU, `count_launches` is {} and
`Captured` one DeviceError line.
"""

from __future__ import annotations

import numpy as np

from .backend import Device, DeviceError, get_device, synchronize

# A CUDA graph's nodes by kind (CUgraphNodeType); kernels are what the issue counts as launches.
NODE_KINDS = {0: "kernels", 1: "copies", 2: "memsets", 3: "host", 4: "graphs", 5: "empty"}


def _libcuda():
    import ctypes
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise DeviceError("the CUDA driver library (libcuda) was not found: cannot count a graph's nodes")


def _capturing_graph_nodes(stream_ptr: int) -> dict:
    """The nodes captured so far on a capturing stream, by kind (driver API: the graph being
    captured, then its nodes and their types). The graph belongs to the capture: not freed here."""
    import ctypes
    cuda = _libcuda()
    status, cap_id, graph = ctypes.c_int(), ctypes.c_ulonglong(), ctypes.c_void_p()
    deps, edges, n_deps = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_size_t()
    stream = ctypes.c_void_p(stream_ptr)
    if hasattr(cuda, "cuStreamGetCaptureInfo_v2"):        # CUDA 11.3+; kept by newer drivers for old builds
        err = cuda.cuStreamGetCaptureInfo_v2(stream, ctypes.byref(status), ctypes.byref(cap_id), ctypes.byref(graph),
                                             ctypes.byref(deps), ctypes.byref(n_deps))
    else:                                                  # CUDA 12.3+: the same, with edge data
        err = cuda.cuStreamGetCaptureInfo_v3(stream, ctypes.byref(status), ctypes.byref(cap_id), ctypes.byref(graph),
                                             ctypes.byref(deps), ctypes.byref(edges), ctypes.byref(n_deps))
    if err != 0 or not graph.value:
        raise DeviceError(f"cuStreamGetCaptureInfo failed (CUresult {err}): cannot count a graph's nodes")
    n = ctypes.c_size_t(0)
    cuda.cuGraphGetNodes(graph, None, ctypes.byref(n))
    nodes = (ctypes.c_void_p * n.value)()
    cuda.cuGraphGetNodes(graph, nodes, ctypes.byref(n))
    counts = {"nodes": n.value}
    kind = ctypes.c_int()
    for node in nodes:
        cuda.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind))
        key = NODE_KINDS.get(kind.value, "other")
        counts[key] = counts.get(key, 0) + 1
    counts.setdefault("kernels", 0)
    return counts


class Captured:
    """fn captured once as a CUDA graph on its own stream, with its own memory pool, and replayed
    per call: every kernel of fn in one launch from the host.

        g = Captured(step, device)    # runs step once eagerly (warm-up), then captures it
        out = g.replay()              # the outputs of the captured call, overwritten in place

    fn must have static shapes and no host synchronisation (no `.get()`, `int(x)`, `.item()` of a
    device value); it reads its inputs from buffers the caller owns and refills between replays
    (`buf[...] = xp.asarray(host)`, a copy queued on the same stream). The intermediate arrays come
    from a private memory pool kept alive with the graph, so nothing else reuses their memory
    between replays. `launches` holds the graph's nodes by kind: the kernels one call issues, the
    same kernels the eager call launches one by one (counted by the driver, cuBLAS's included)."""

    def __init__(self, fn, device: Device | None = None) -> None:
        device = get_device("cuda") if device is None else device
        cp = device.xp
        if cp is np:
            raise DeviceError("a CUDA graph needs --device cuda")
        self.fn, self.xp = fn, cp
        self.stream = cp.cuda.Stream(non_blocking=True)            # capture needs a stream of its own
        synchronize(cp)                                            # what the host queued before is done
        self.pool = cp.cuda.MemoryPool()
        with self.stream, cp.cuda.using_allocator(self.pool.malloc):
            fn()                                           # eager warm-up: kernels compiled, workspaces made
            self.stream.synchronize()
            self.stream.begin_capture()
            try:
                self.outputs = fn()
                self.launches = _capturing_graph_nodes(self.stream.ptr)
            finally:
                self.graph = self.stream.end_capture()     # ends the capture even if fn failed
        self.graph.upload(self.stream)

    def replay(self):
        """One launch of the whole captured call, on the current stream (so it runs after whatever the
        host queued there, and `.get()` or `synchronize` waits for it); returns fn's outputs."""
        self.graph.launch(self.xp.cuda.get_current_stream())
        return self.outputs


def count_launches(fn, device: Device | None = None) -> dict:
    """The device operations one call of fn issues, counted from a CUDA graph capture of it:
    {"nodes", "kernels", "copies", "memsets", ...}. Nothing runs during a capture: fn's device work
    is recorded, not done (its Python side effects still happen: count a step with no host state,
    like the static decode step). fn must not synchronise with the host. On the CPU: {} (NumPy has
    no kernels to count; the meter's per-operation `calls` are the CPU's equivalent)."""
    device = get_device("cpu") if device is None else device
    if not device.is_gpu:
        return {}
    cp = device.xp
    synchronize(cp)
    stream = cp.cuda.Stream(non_blocking=True)
    pool = cp.cuda.MemoryPool()
    with stream, cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        try:
            fn()
            counts = _capturing_graph_nodes(stream.ptr)
        finally:
            stream.end_capture()
    return counts

"""PyTorch AOTInductor backend: ``.pt2`` packages compiled ahead of time, run on a CUDA GPU.

An AOTInductor package is the closest thing to a TensorRT plan that the machines here can both
build and run: kernels compiled for one GPU architecture, linked against one torch, loaded by
deserialization (torch's AOTInductor package loader).  It is named and bound like a plan
(``sm90-torch2.11-fp16.pt2``, see :mod:`tidal.runtime.core.engines`) and goes through the same
cold store, sha256 check and engine cache.

Package layout.  The compiled model is packaged *without* its weights
(``aot_inductor.package_constants_in_so=False``); the builder (:mod:`tidal.runtime.builder.pt2`)
appends to the same zip a stored (uncompressed) ``<archive>/tidal/weights.bin`` — every constant,
256-byte aligned — and ``<archive>/tidal/manifest.json`` — the constants' offsets, dtypes and shapes
and the model's input and output tensors.  So one file, one sha256, and the runtime controls how the
weights reach the device.  Loading, in timed phases (``Engine.load_phases``):

1. ``deserialize``: torch's C++ package loader (``torch._C._aoti.AOTIModelPackageLoader``,
   what ``aoti_load_package`` wraps; :class:`DirectPackage`) extracts and dlopens the compiled
   wrapper (whose constructor sets the CUDA device), always on the backend's one loader thread
   (:class:`DedicatedThread`, its device made current first), one load at a time, whichever
   worker thread of the engine cache asked.  (Added while a load segfaulted on the H200; that
   turned out not to depend on the thread but on how the wrapper was linked, see
   ``PACKAGE_INDUCTOR_CONFIGS``; bench/results/gpu_bench-h200-2026-12-04b.txt);
2. ``stage``: the weight blob goes from the file to one device allocation through
   :mod:`tidal.runtime.backends.staging` (issue 46): 64 MiB chunks read by one thread per core
   with ``preadv`` into a ring of pinned buffers that the backend keeps (grown to at most
   cores + 4 chunks, never per load), each chunk copied to the device on a copy stream as soon
   as it has arrived, so reading and the H2D copy overlap; one load at a time per backend;
3. ``h2d``: the constants are handed to the model as views of the device blob
   (``load_constants(..., user_managed=True)``: no second copy);
4. ``profile``: one run at ``maxBatchSize`` with the allocator's peak reset, which measures the
   activation workspace the engine needs;
5. ``graphs``: one CUDA graph per batch size 1..``maxBatchSize`` (input H2D from pinned
   buffers, the model, output D2H into pinned buffers), checked against the eager path.  The
   engine's ``size_bytes`` is weights + I/O buffers + that workspace + the graphs' memory pool,
   so the cache accounts for what the engine really takes.

Phases 4 and 5 run on the loader thread, on the *capture* stream of one of the backend's stream
slots (:class:`StreamSlot`); each slot's cuBLAS workspace is made at the backend's start and
counted in ``overhead_bytes``, which the engine cache takes out of its budget.  (Before issue
34 every engine had a new stream, and every stream a new 32 MiB cuBLAS workspace that nothing
freed: under churn the device grew past the budget.)

Requests: the input rows are copied into the pinned buffers and the batch size's graph replays
on the slot's serving stream (no graph for that size: the same steps run eagerly); the caller
gets copies of the pinned output rows.  Closing an engine drops its graphs and every device
tensor and empties the caching allocator, so an eviction frees real device memory (checked
with ``cudaMemGetInfo`` in tests/gpu/).  A node may limit how many loads run at once across its
runtime processes (:class:`NodeLoadGate`).

Loads that cannot fit are refused with the reason (free bytes against needed bytes) before any
allocation; an out-of-memory error during a load becomes an :class:`EngineLoadError` after the
partial engine is freed.  Torch is imported on first use: this module imports without it, and
the manifest and layout code is tested in CI, which has neither torch nor a GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.engines import EngineDescriptor, EngineTarget, parse_torch_version
from ..errors import BackendError, EngineLoadError
from . import DeviceMemory, TensorSpec, staging

MANIFEST_NAME = "tidal/manifest.json"
WEIGHTS_NAME = "tidal/weights.bin"
STAGE_CHUNK = 64 << 20
STAGE_THREADS = 8
# Kept free on the device beyond an engine's own bytes when deciding whether a load can fit
# (CUDA context growth, cuBLAS workspaces, allocator rounding).
LOAD_HEADROOM_BYTES = 256 << 20
MANIFEST_VERSION = 1
# The loader thread's stack: the process's main thread gets RLIMIT_STACK (8 MiB or more, grown
# on demand), a new thread the platform's default (glibc: 2 MiB when RLIMIT_STACK is
# unlimited).  Address space only; pages are touched as used.
LOADER_STACK_BYTES = 64 << 20
# Counted in the backend's overhead beyond the measured cuBLAS workspaces: the caching
# allocator's rounding and an engine's first load, reserved at its weights' size until measured.
ALLOCATOR_SLACK_BYTES = 32 << 20


@dataclass(frozen=True)
class ConstantEntry:
    fqn: str
    dtype: str  # numpy dtype name: float16, float32, ...
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Pt2Manifest:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    constants: tuple[ConstantEntry, ...]
    weights_bytes: int
    device: str  # "cuda" or "cpu"
    torch_version: str


# Constant dtypes that numpy lacks (name: bytes per element): bf16 and fp8 packages' weights.
TORCH_ONLY_DTYPES: dict[str, int] = {
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def dtype_name(name: str) -> str:
    """A constant's dtype as the manifest writes it: numpy's name, or torch's for the types
    numpy lacks (:data:`TORCH_ONLY_DTYPES`); unknown names raise ``TypeError``."""
    if name in TORCH_ONLY_DTYPES:
        return name
    return str(np.dtype(name))


def itemsize(name: str) -> int:
    return TORCH_ONLY_DTYPES.get(name) or np.dtype(name).itemsize


def parse_manifest(text: str) -> Pt2Manifest:
    """Read a manifest; a missing field or a layout that overlaps raises EngineLoadError."""
    try:
        data = json.loads(text)
        if data.get("version") != MANIFEST_VERSION:
            raise EngineLoadError(f"tidal manifest version {data.get('version')!r} is not 1")

        def tensors(key: str) -> tuple[TensorSpec, ...]:
            return tuple(
                TensorSpec(t["name"], t["datatype"], tuple(int(d) for d in t["shape"]))
                for t in data[key]
            )

        constants = tuple(
            ConstantEntry(
                c["fqn"],
                dtype_name(str(c["dtype"])),
                tuple(int(d) for d in c["shape"]),
                int(c["offset"]),
                int(c["nbytes"]),
            )
            for c in data["constants"]
        )
        manifest = Pt2Manifest(
            inputs=tensors("inputs"),
            outputs=tensors("outputs"),
            constants=constants,
            weights_bytes=int(data["weightsBytes"]),
            device=str(data["device"]),
            torch_version=str(data["torch"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, EngineLoadError):
            raise
        raise EngineLoadError(f"invalid tidal manifest in the package: {exc!r}") from None
    end = 0
    for c in sorted(manifest.constants, key=lambda c: c.offset):
        count = int(np.prod(c.shape)) if c.shape else 1
        if count * itemsize(c.dtype) != c.nbytes:
            raise EngineLoadError(f"constant {c.fqn!r}: {c.nbytes}B does not match its shape")
        if c.offset < end or c.offset + c.nbytes > manifest.weights_bytes:
            raise EngineLoadError(f"constant {c.fqn!r} overlaps another or the blob's end")
        end = c.offset + c.nbytes
    return manifest


def _archive_prefix(names: list[str]) -> str:
    """The top folder of a PT2 archive (``model/`` in ``model/data/aotinductor/...``)."""
    for name in names:
        if name.endswith("archive_format"):
            return name[: -len("archive_format")]
    raise EngineLoadError("not a PT2 archive: it has no archive_format entry")


@dataclass(frozen=True)
class TidalSection:
    manifest: Pt2Manifest
    weights_offset: int  # where the stored weight blob starts in the file


def read_tidal_section(package: Path) -> TidalSection:
    """The manifest and the file offset of the weights, without reading the weights."""
    try:
        with zipfile.ZipFile(package) as archive:
            prefix = _archive_prefix(archive.namelist())
            manifest = parse_manifest(archive.read(prefix + MANIFEST_NAME).decode())
            info = archive.getinfo(prefix + WEIGHTS_NAME)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise EngineLoadError(
            f"{package.name} is not a tidal AOTInductor package (see "
            f"runtime/backends/torch_aoti.py): {exc}"
        ) from None
    if info.compress_type != zipfile.ZIP_STORED or info.file_size != manifest.weights_bytes:
        raise EngineLoadError(f"{package.name}: the weight blob must be stored uncompressed")
    with package.open("rb") as handle:
        handle.seek(info.header_offset)
        local = handle.read(30)
    if local[:4] != b"PK\x03\x04":
        raise EngineLoadError(f"{package.name}: bad zip local header for the weights")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return TidalSection(manifest, info.header_offset + 30 + name_len + extra_len)


def read_into(path: Path, offset: int, target: memoryview, threads: int = STAGE_THREADS) -> None:
    """Fill ``target`` from ``path`` at ``offset`` with parallel ``preadv`` (GIL released)."""
    fd = os.open(path, os.O_RDONLY)
    try:

        def read_chunk(start: int) -> None:
            view = target[start : min(start + STAGE_CHUNK, len(target))]
            done = 0
            while done < len(view):
                got = os.preadv(fd, [view[done:]], offset + start + done)
                if got <= 0:
                    raise EngineLoadError(f"{path.name}: file ended inside the weight blob")
                done += got

        starts = range(0, len(target), STAGE_CHUNK)
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(starts)))) as pool:
            list(pool.map(read_chunk, starts))
    finally:
        os.close(fd)


def footprint_bytes(weights: int, io_buffers: int, workspace_peak: int) -> int:
    """Device bytes one engine holds: weights, its I/O buffers and its measured workspace."""
    return weights + io_buffers + workspace_peak


def fits_free_memory(need_bytes: int, free_bytes: int) -> str | None:
    """None when ``need_bytes`` fit in ``free_bytes`` with headroom, else why not."""
    if need_bytes + LOAD_HEADROOM_BYTES > free_bytes:
        return (
            f"the device has {free_bytes}B free; this engine needs {need_bytes}B plus "
            f"{LOAD_HEADROOM_BYTES}B headroom"
        )
    return None


class DedicatedThread:
    """One long-lived thread that runs the calls handed to it, one at a time, in order.

    Started with a stack of ``stack_bytes`` (``threading.stack_size`` is set only while the
    thread is created); ``initializer`` runs on it before any call (the torch backend makes its
    CUDA device current there).  ``call`` blocks the calling thread until the result (or the
    exception) comes back; called from the dedicated thread itself it runs inline.
    """

    def __init__(
        self, name: str, stack_bytes: int, initializer: Callable[[], None] | None = None
    ) -> None:
        previous = threading.stack_size(stack_bytes)
        try:
            self._pool = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=name, initializer=initializer
            )
            # Start the thread now, while the stack size is set (and run the initializer).
            self.ident = self._pool.submit(threading.get_ident).result()
        finally:
            threading.stack_size(previous)

    def call(self, func: Callable[..., Any], *args: Any) -> Any:
        if threading.get_ident() == self.ident:
            return func(*args)
        return self._pool.submit(func, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def import_torch() -> Any:
    """Torch alone: not ``torch._inductor``, which imports dynamo, sympy and the compiler stack
    (6.1 s of a 12.5 s replica start on an H100, bench/results/gpu_issue34-h100-2026-12-06a.txt);
    packages load through the C++ loader (:class:`DirectPackage`)."""
    try:
        import torch
    except ImportError as exc:
        raise EngineLoadError(
            f"the torch backend needs PyTorch (pip install 'tidal[torch]'): {exc}"
        ) from None
    return torch


def why_no_cuda() -> str | None:
    """None when torch is installed and sees a CUDA device, else why not (the GPU tests' skip
    reason)."""
    try:
        import torch
    except ImportError as exc:
        return f"needs PyTorch with CUDA (pip install 'tidal[torch]'): {exc}"
    if not torch.cuda.is_available():
        return f"needs a CUDA device; torch {torch.__version__} sees none"
    return None


def prime_cpu_isa(cpu_vec_isa: Any) -> str:
    """Fill inductor's CPU vector-ISA caches from the CPU's own flags, compiling nothing.

    Used only where packages load through the Python wrapper (:class:`DirectPackage` avoids
    it).  ``aoti_load_package`` records the host's ISA next to the package's (a warning on a
    mismatch) through ``pick_vec_isa()``; in torch 2.11 that dry-compiles up to four probe
    programs with the C++ compiler and, for each, starts a new Python that imports torch to load
    it (``VecISA.check_build``) — whatever ``TORCHINDUCTOR_VEC_ISA_OK`` says, because the
    AVX-512 bf16, VNNI and AMX checks call it directly: 29-34 s of every GPU replica's start
    on an H100 (bench/results/gpu_issue34-h100-2026-12-06a.txt and b).  Every probe is reached
    only once ``torch.cpu`` (cpuid) has said the CPU has the instructions, so answering "it builds"
    gives the list cpuid gives; the results stay cached for the process (``functools.cache``),
    which compiles nothing for the CPU anyway (CUDA packages only).  Returns the ISA's name.
    """
    original = cpu_vec_isa.VecISA.check_build
    cpu_vec_isa.VecISA.check_build = lambda self, code: True
    try:
        return str(cpu_vec_isa.pick_vec_isa())
    finally:
        cpu_vec_isa.VecISA.check_build = original


class DirectPackage:
    """A package loaded by torch's C++ loader (``torch._C._aoti.AOTIModelPackageLoader``)
    without the Python wrapper ``aoti_load_package`` returns: that one needs
    ``torch._inductor`` imported and checks the host's CPU ISA on the first load of a process
    (see :func:`prime_cpu_isa`).  Offers what the engine uses: ``loader.run``,
    ``load_constants`` and a call."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def load_constants(
        self, constants: dict[str, Any], *, check_full_update: bool, user_managed: bool = False
    ) -> None:
        # (constants, use_inactive, check_full_update, user_managed), as the wrapper passes it
        self.loader.load_constants(constants, False, check_full_update, user_managed)

    def __call__(self, *args: Any) -> Any:
        return self.loader.run(list(args))


class NodeLoadGate:
    """At most ``slots`` cold loads at a time on one node, across processes.

    Each slot is a file in ``folder`` (a hostPath every runtime pod of the node mounts) held
    with ``flock`` for the part of a load that moves the weights (file -> pinned -> device) and
    runs the engine's first kernels; the kernel releases it if the process dies.  Every
    acquisition opens its own file description, so two loads of one process exclude each other
    too.  Configured by ``TIDAL_NODE_LOAD_DIR`` (and ``TIDAL_NODE_LOAD_SLOTS``, default 1).
    """

    def __init__(self, folder: Path, slots: int = 1, poll_s: float = 0.002) -> None:
        if slots < 1:
            raise ValueError("a node load gate needs at least one slot")
        self.folder = folder
        self.slots = slots
        self.poll_s = poll_s
        folder.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> NodeLoadGate | None:
        env = os.environ if environ is None else environ
        folder = env.get("TIDAL_NODE_LOAD_DIR", "")
        if not folder:
            return None
        return cls(Path(folder), int(env.get("TIDAL_NODE_LOAD_SLOTS", "1") or 1))

    @contextlib.contextmanager
    def hold(self) -> Iterator[float]:
        """Hold one slot for the ``with`` body; yields the seconds waited for it."""
        import fcntl

        started = time.perf_counter()
        handle = None
        while handle is None:
            for slot in range(self.slots):
                candidate = open(self.folder / f"load-{slot}.lock", "a+b")  # noqa: SIM115
                try:
                    fcntl.flock(candidate, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    candidate.close()
                    continue
                handle = candidate
                break
            else:
                time.sleep(self.poll_s)
        try:
            yield time.perf_counter() - started
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()


@dataclass
class StreamSlot:
    """A serving stream (requests run and graphs replay on it) and a capture stream that only
    the backend's loader thread uses (profile runs, graph warm-up and capture).  Graphs captured
    on one slot share the capture stream's cuBLAS workspace, so they all replay on the slot's
    one serving stream (in stream order, never at once)."""

    serve: Any
    capture: Any


def graphs_enabled(environ: dict[str, str] | None = None) -> bool:
    """CUDA graphs are captured at load unless ``TIDAL_TORCH_CUDA_GRAPHS=0``."""
    env = os.environ if environ is None else environ
    return env.get("TIDAL_TORCH_CUDA_GRAPHS", "1") not in ("0", "false", "no")


class TorchEngine:
    """One loaded AOTInductor package with its weights, stream, I/O buffers and CUDA graphs.

    Requests copy their rows into pinned input buffers; then, for a batch size with a captured
    graph, one graph replay does the rest on the slot's serving stream (input H2D, the model,
    output D2H into pinned output buffers); other batch sizes (or a package whose capture
    failed) run the same steps eagerly.  The caller gets copies of the pinned output rows.
    """

    platform = "pytorch_aoti"

    def __init__(
        self,
        torch: Any,
        compiled: Any,
        manifest: Pt2Manifest,
        device: Any,
        weights: Any,
        max_batch_size: int,
        load_phases: dict[str, float],
        slot: StreamSlot | None = None,
        device_lock: Any = None,
    ) -> None:
        self._torch = torch
        self._compiled = compiled
        # The package's own entry point, a list of tensors in and a list out, on the current
        # stream: not AOTICompiledModel.__call__, which parses the call spec (two pytree specs
        # from JSON) and flattens its arguments again on every call.
        loader: Any = getattr(compiled, "loader", None)
        self._run_flat: Any = getattr(loader, "run", None)
        self._device = device
        self._weights = weights  # one uint8 tensor on the device; the constants are views of it
        self._cuda = device.type == "cuda"
        if self._cuda and slot is None:
            slot = StreamSlot(torch.cuda.Stream(device=device), torch.cuda.Stream(device=device))
        self._slot = slot
        self._stream = slot.serve if slot is not None else None
        self._done = torch.cuda.Event() if self._cuda else None
        self._lock = threading.Lock()
        self._device_lock = device_lock if device_lock is not None else threading.RLock()
        self.inputs = manifest.inputs
        self.outputs = manifest.outputs
        self.max_batch_size = max_batch_size
        self.load_phases = load_phases
        self.weights_bytes = manifest.weights_bytes
        self.io_bytes = 0
        self.workspace_bytes = 0
        self.graph_bytes = 0
        self.graph_error: str | None = None
        self._graphs: dict[int, Any] = {}
        self._pool: Any = None
        self._graph_io: tuple[list[Any], ...] = ()
        self._pinned: Any = None  # cudamem.DeviceAllocator of the pinned I/O buffers
        self._in_dev: list[Any] = []
        self._in_host: list[Any] = []
        self._in_host_np: list[np.ndarray[Any, Any]] = []  # numpy views of the pinned buffers
        self._out_host: list[Any] = []
        self._out_host_np: list[np.ndarray[Any, Any]] = []
        from ..protocol import DATATYPES

        self._np_types = [np.dtype(DATATYPES[s.datatype]) for s in self.inputs]
        # Inputs with no dynamic dimension but the batch: rows go into the buffers as they are.
        self._static_rows = all(d > 0 for s in self.inputs for d in s.shape[1:])
        if self._cuda:
            for spec, dtype in zip(self.inputs, self._np_types, strict=True):
                shape = [max_batch_size] + [d if d > 0 else 1 for d in spec.shape[1:]]
                tdtype = torch.from_numpy(np.empty(0, dtype)).dtype
                self._in_dev.append(torch.empty(shape, dtype=tdtype, device=device))
                self._in_host.append(self._pinned_empty(tuple(shape), tdtype))
                self._in_host_np.append(self._in_host[-1].numpy())
                self.io_bytes += self._in_dev[-1].nbytes
        self.size_bytes = self._footprint()

    def _pinned_empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A page-locked host tensor from cudaMallocHost (cuda-python), outside torch's caching
        host allocator: that one records an event on every async copy, which a graph capture
        cannot hold.  Torch's own pinned memory where cuda-python or the dtype is missing."""
        torch = self._torch
        try:
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
            if self._pinned is None:
                from . import cudamem

                self._pinned = cudamem.DeviceAllocator()
            count = int(np.prod(shape)) if shape else 1
            buffer = self._pinned.alloc_pinned(count * np_dtype.itemsize)
            return torch.from_numpy(buffer.as_array(np_dtype, shape))
        except Exception:
            return torch.empty(shape, dtype=dtype, pin_memory=True)

    def _footprint(self) -> int:
        return footprint_bytes(self.weights_bytes, self.io_bytes, self.workspace_bytes) + (
            self.graph_bytes
        )

    def stream_handle(self) -> int:
        return int(self._stream.cuda_stream) if self._stream is not None else 0

    @property
    def graph_batch_sizes(self) -> list[int]:
        return sorted(self._graphs)

    # -- loading (on the backend's loader thread) ----------------------------------------------

    def profile(self) -> float:
        """Run once at ``max_batch_size`` (on the capture stream), measuring the activation
        workspace and sizing the pinned output buffers; returns seconds."""
        from . import warmup_inputs

        torch = self._torch
        started = time.perf_counter()
        inputs = warmup_inputs(self, self.max_batch_size)
        with self._lock:
            if not self._cuda:
                self._run(inputs)
                return time.perf_counter() - started
            assert self._slot is not None
            capture = self._slot.capture
            capture.synchronize()
            base = torch.cuda.memory_allocated(self._device)
            torch.cuda.reset_peak_memory_stats(self._device)
            with torch.cuda.stream(capture):
                arrays = self._stage_inputs(inputs)
                outs = self._launch(arrays[0].shape[0], arrays)
                self._out_host = [self._pinned_empty(tuple(o.shape), o.dtype) for o in outs]
                self._out_host_np = [h.numpy() for h in self._out_host]
                for out, host in zip(outs, self._out_host, strict=True):
                    host.copy_(out, non_blocking=True)
                del outs
            capture.synchronize()
            peak = torch.cuda.max_memory_allocated(self._device)
            self.workspace_bytes = max(0, peak - base)
            self.size_bytes = self._footprint()
        return time.perf_counter() - started

    def capture_graphs(self, batch_sizes: list[int] | None = None) -> float:
        """Capture one CUDA graph per batch size (default 1..maxBatchSize): input H2D from the
        pinned buffers, the model, output D2H into the pinned buffers, all in one replay.
        Checked against the eager path at the smallest and largest size; on any failure the
        engine keeps running eagerly and ``graph_error`` says why.  Returns seconds."""
        torch = self._torch
        started = time.perf_counter()
        if not self._cuda or self._run_flat is None:
            self.graph_error = "no CUDA device or no loader.run"
            return 0.0
        if not self._static_rows:
            self.graph_error = "inputs with dynamic non-batch dimensions"
            return 0.0
        if not self._out_host:
            self.graph_error = "not profiled: no output buffers"
            return 0.0
        sizes = batch_sizes or list(range(1, self.max_batch_size + 1))
        assert self._slot is not None
        capture = self._slot.capture
        graphs: dict[int, Any] = {}
        with self._lock, self._device_lock:
            reserved = torch.cuda.memory_reserved(self._device)
            pool = torch.cuda.graph_pool_handle()
            try:
                with torch.cuda.stream(capture):
                    for rows in sizes:
                        self._graph_body(rows)  # warm-up: lazy module loads happen outside
                        graph = torch.cuda.CUDAGraph()
                        graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                        try:
                            self._graph_body(rows)
                        finally:
                            graph.capture_end()
                        graphs[rows] = graph
                capture.synchronize()
                self._graphs, self._pool = graphs, pool
                # The buffers the graphs read and write, kept for as long as the graphs are.
                self._graph_io = (list(self._in_host), list(self._in_dev), list(self._out_host))
                self.graph_bytes = self._pool_bytes(pool, reserved)
                self._check_graphs([sizes[0], sizes[-1]])
            except Exception as exc:  # capture not supported by this package: run eagerly
                for graph in graphs.values():
                    graph.reset()
                self._graphs, self._pool = {}, None
                self.graph_bytes = 0
                self.graph_error = f"{type(exc).__name__}: {exc}"[:300]
                with contextlib.suppress(Exception):
                    capture.synchronize()
            self.size_bytes = self._footprint()
        return time.perf_counter() - started

    def _graph_body(self, rows: int) -> None:
        for host, dev in zip(self._in_host, self._in_dev, strict=True):
            dev[:rows].copy_(host[:rows], non_blocking=True)
        outs = self._run_flat([dev[:rows] for dev in self._in_dev])
        for out, host in zip(outs, self._out_host, strict=True):
            host[:rows].copy_(out, non_blocking=True)

    def _pool_bytes(self, pool: Any, reserved_before: int) -> int:
        """Device bytes held by the graphs' private memory pool."""
        torch = self._torch
        grown = max(0, torch.cuda.memory_reserved(self._device) - reserved_before)
        try:
            held = sum(
                int(seg["total_size"])
                for seg in torch.cuda.memory_snapshot()
                if tuple(seg.get("segment_pool_id", ())) == tuple(pool)
            )
        except Exception:  # the snapshot's layout is private: the allocator's growth then
            held = 0
        return held or grown

    def _check_graphs(self, sizes: list[int]) -> None:
        """Each size's replay against the eager path on the same random rows, both on the
        capture stream (the loader thread's cuBLAS handle has its workspace there only)."""
        assert self._slot is not None
        serve, self._stream = self._stream, self._slot.capture
        try:
            self._check_graphs_on_stream(sizes)
        finally:
            self._stream = serve

    def _check_graphs_on_stream(self, sizes: list[int]) -> None:
        rng = np.random.default_rng(0)
        for rows in sorted(set(sizes)):
            arrays = {
                s.name: rng.standard_normal((rows, *h.shape[1:])).astype(t)
                for s, h, t in zip(self.inputs, self._in_host_np, self._np_types, strict=True)
            }
            graphs, self._graphs = self._graphs, {}
            try:
                eager = self._run(arrays)
            finally:
                self._graphs = graphs
            replayed = self._run(arrays)
            for name, want in eager.items():
                got = replayed[name]
                if got.shape != want.shape or not np.allclose(
                    got.astype(np.float32), want.astype(np.float32), atol=1e-2, rtol=1e-2
                ):
                    raise BackendError(f"graph replay at batch {rows} differs on {name!r}")

    # -- requests --------------------------------------------------------------------------

    def infer(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        with self._lock:
            return self._run(inputs)

    def _stage_inputs(self, inputs: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
        """Each input's rows in its pinned buffer; returns the pinned views (torch)."""
        views = []
        for spec, dtype, host_np, host in zip(
            self.inputs, self._np_types, self._in_host_np, self._in_host, strict=True
        ):
            array = np.asarray(inputs[spec.name], dtype=dtype)
            rows = array.shape[0]
            if rows > self.max_batch_size:
                raise EngineLoadError(
                    f"batch of {rows} rows exceeds maxBatchSize {self.max_batch_size}"
                )
            if array.shape[1:] == host_np.shape[1:]:  # the first `rows` rows of the buffers
                np.copyto(host_np[:rows], array, casting="no")
                views.append(host[:rows])
            else:  # other trailing dimensions (dynamic ones): the first elements, reshaped
                flat = host_np.reshape(-1)[: array.size].reshape(array.shape)
                np.copyto(flat, array, casting="no")
                views.append(host.view(-1)[: array.size].view(array.shape))
        return views

    def _launch(self, rows: int, pinned: list[Any]) -> list[Any]:
        """H2D of the pinned inputs and the model, on the current stream; the device outputs."""
        args = []
        for view, dev in zip(pinned, self._in_dev, strict=True):
            target = (
                dev[:rows]
                if view.shape[1:] == dev.shape[1:]
                else (dev.view(-1)[: view.numel()].view(view.shape))
            )
            target.copy_(view, non_blocking=True)
            args.append(target)
        if self._run_flat is not None:
            return list(self._run_flat(args))
        results = self._compiled(*args)
        return list(results) if isinstance(results, list | tuple) else [results]

    def _run(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        torch = self._torch
        if self._compiled is None:
            raise BackendError("the engine was closed")
        if not self._cuda:
            arrays = [
                np.asarray(inputs[s.name], dtype=t)
                for s, t in zip(self.inputs, self._np_types, strict=True)
            ]
            if arrays[0].shape[0] > self.max_batch_size:
                raise EngineLoadError(
                    f"batch of {arrays[0].shape[0]} rows exceeds maxBatchSize {self.max_batch_size}"
                )
            results = self._compiled(*[torch.from_numpy(a) for a in arrays])
            cpu_outs = results if isinstance(results, list | tuple) else [results]
            return {s.name: o.detach().numpy() for s, o in zip(self.outputs, cpu_outs, strict=True)}
        assert self._stream is not None and self._done is not None
        pinned = self._stage_inputs(inputs)
        rows = pinned[0].shape[0]
        graph = self._graphs.get(rows)
        outs: list[Any] | None = None
        with torch.cuda.stream(self._stream):
            if graph is not None and all(
                p.shape[1:] == h.shape[1:] for p, h in zip(pinned, self._in_host, strict=True)
            ):
                graph.replay()
            else:
                outs = self._launch(rows, pinned)
                for i, out in enumerate(outs):
                    host = self._out_host[i] if i < len(self._out_host) else None
                    if host is None or out.numel() > host.numel():
                        host = self._pinned_empty(tuple(out.shape), out.dtype)
                        if i < len(self._out_host):
                            self._out_host[i], self._out_host_np[i] = host, host.numpy()
                        else:
                            self._out_host.append(host)
                            self._out_host_np.append(host.numpy())
                    if out.shape[1:] == host.shape[1:]:
                        host[: out.shape[0]].copy_(out, non_blocking=True)
                    else:
                        host.view(-1)[: out.numel()].view(out.shape).copy_(out, non_blocking=True)
            self._done.record(self._stream)
        self._done.synchronize()
        # Copies: the pinned buffers are reused by the next batch.
        if outs is None:
            return {
                s.name: h[:rows].copy()
                for s, h in zip(self.outputs, self._out_host_np, strict=True)
            }
        result = {}
        for spec, out, host in zip(self.outputs, outs, self._out_host_np, strict=True):
            if tuple(out.shape[1:]) == host.shape[1:]:
                result[spec.name] = host[: out.shape[0]].copy()
            else:
                result[spec.name] = host.reshape(-1)[: out.numel()].reshape(out.shape).copy()
        return result

    def close(self) -> None:
        torch = self._torch
        with self._lock, self._device_lock:
            if self._stream is not None:
                self._stream.synchronize()
            for graph in self._graphs.values():
                graph.reset()
            self._graphs, self._pool, self._graph_io = {}, None, ()
            self._compiled = self._run_flat = None
            if self._weights is not None and self._cuda:
                # (On a CPU the weights are the staging tensor, whose storage numpy has seen:
                # not resizable; it goes with its references.)
                # Free the weights' memory now, whoever still refers to it: torch 2.11's
                # load_constants(user_managed=True) keeps a new tensor handle per constant that
                # it never releases, so dropping our references freed nothing (an eviction gave
                # 0 MiB back on the H200, bench/results/gpu_bench-h200-2026-12-04b.txt).  The
                # model that used those handles is gone with ``_compiled``.
                self._weights.untyped_storage().resize_(0)
            self._weights = None
            self._in_dev, self._in_host, self._in_host_np = [], [], []
            self._out_host, self._out_host_np = [], []
            if self._cuda:
                torch.cuda.synchronize(self._device)
                if self._pinned is not None:
                    self._pinned.close()  # cudaFreeHost: nothing refers to them any more
                    self._pinned = None
                # The graphs' pool and the cached activation blocks go back to the device.  The
                # cuBLAS workspaces stay: one per stream slot, made at the backend's start and
                # counted in its overhead_bytes (never per engine, so churn cannot grow them).
                torch.cuda.empty_cache()


class TorchAOTIBackend:
    """Loads tidal ``.pt2`` packages with torch's C++ AOTInductor package loader.

    Start-up (``start_phases``, seconds): ``import`` (torch alone), ``cuda`` (the device's
    context), ``streams`` (the stream slots and their cuBLAS workspaces, on the loader thread);
    ``isa`` (:func:`prime_cpu_isa`) only where packages load through the Python wrapper.
    ``memory_limit_bytes``: the caching allocator may hold at most this many bytes
    (``torch.cuda.set_per_process_memory_fraction``), so whatever the accounting misses cannot
    take the device beyond the budget.
    """

    name = "torch"

    def __init__(
        self,
        device: str | int = 0,
        *,
        memory_limit_bytes: int | None = None,
        stream_slots: int | None = None,
    ) -> None:
        self.start_phases: dict[str, float] = {}
        started = time.perf_counter()
        self._torch = torch = import_torch()
        self.start_phases["import"] = time.perf_counter() - started
        self._device_lock = threading.RLock()
        self._slots: list[StreamSlot] = []
        self._next_slot = 0
        self.workspace_bytes = 0
        # Device bytes this backend holds whatever engines are loaded (the slots' cuBLAS
        # workspaces, measured at start, and ALLOCATOR_SLACK_BYTES): the engine cache gives its
        # engines the budget less these.
        self.overhead_bytes = 0
        self.gate = NodeLoadGate.from_env()
        self._ring: staging.PinnedRing | None = None
        self._stage_lock = threading.Lock()  # one load at a time through the ring
        started = time.perf_counter()
        if device == "cpu":
            self.device = torch.device("cpu")
            self.gpu_arch = "cpu"
        else:
            if not torch.cuda.is_available():
                raise EngineLoadError("the torch backend found no CUDA device (torch.cuda)")
            self.device = torch.device("cuda", int(device))
            torch.cuda.set_device(self.device)
            torch.cuda.init()
            major, minor = torch.cuda.get_device_capability(self.device)
            self.gpu_arch = f"sm{major}{minor}"
        self.torch_version = parse_torch_version(torch.__version__)
        self.start_phases["cuda"] = time.perf_counter() - started
        # Which loader loaded the packages: "torch._C._aoti" (the C++ one, no torch._inductor)
        # or "aoti_load_package" (the Python wrapper, where the C++ binding differs).
        self.package_loader: str | None = None
        self.cpu_isa: str | None = None  # primed only if the Python wrapper is used
        started = time.perf_counter()
        if stream_slots is None:
            stream_slots = int(os.environ.get("TIDAL_TORCH_STREAM_SLOTS", "2") or 2)
        self._want_slots = max(1, stream_slots)
        # Package loads, profiles and graph captures run on this one thread (see the module's
        # docstring, phase 1): its cuBLAS handle is the only one whose workspaces graphs use.
        try:
            self._loader = DedicatedThread(
                "tidal-aoti-load", LOADER_STACK_BYTES, self._make_device_current
            )
        except Exception as exc:  # the initializer failed: BrokenThreadPool
            raise EngineLoadError(
                f"the torch backend's loader thread did not start: {exc}"
            ) from None
        self.start_phases["streams"] = time.perf_counter() - started
        if memory_limit_bytes is not None:
            self.limit_device_memory(memory_limit_bytes)

    def _staging_ring(self, nbytes: int) -> staging.PinnedRing:
        """The backend's pinned staging ring, grown (never shrunk) to what a load of ``nbytes``
        can use: one 64 MiB buffer per reader thread and a few in flight, fewer for small
        engines."""
        threads = staging.default_threads()
        want = min(staging.ring_buffers_for(threads), -(-nbytes // staging.CHUNK_BYTES) + 1)
        with self._device_lock:
            if self._ring is None:
                self._ring = staging.PinnedRing(self._torch, 0)
            self._ring.grow(want)
            return self._ring

    def _make_device_current(self) -> None:
        """On the loader thread: the device current, the stream slots made, and each capture
        stream's cuBLAS workspace allocated now (outside any graph) and counted."""
        if self.device.type != "cuda":
            return
        torch = self._torch
        torch.cuda.set_device(self.device)
        torch.empty(1, device=self.device).zero_()
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_reserved(self.device)
        for _ in range(self._want_slots):
            slot = StreamSlot(
                torch.cuda.Stream(device=self.device), torch.cuda.Stream(device=self.device)
            )
            with torch.cuda.stream(slot.capture):
                a = torch.ones(64, 64, dtype=torch.float16, device=self.device)
                b = torch.nn.functional.linear(a, a, a[0])  # addmm with bias: cuBLASLt
                c = torch.mm(a, a)  # cuBLAS
            slot.capture.synchronize()
            del a, b, c
            self._slots.append(slot)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.workspace_bytes = max(0, torch.cuda.memory_reserved(self.device) - before)
        self.overhead_bytes = self.workspace_bytes + ALLOCATOR_SLACK_BYTES

    def limit_device_memory(self, nbytes: int | None) -> None:
        """Cap what the caching allocator may hold (None: no cap)."""
        if self.device.type != "cuda":
            return
        torch = self._torch
        total = torch.cuda.get_device_properties(self.device).total_memory
        fraction = 1.0 if nbytes is None else max(0.0, min(1.0, nbytes / total))
        torch.cuda.set_per_process_memory_fraction(fraction, self.device)

    def _load_package(self, path: Path) -> Any:
        """On the loader thread.  Single-threaded runners: no container bookkeeping (events, a
        model pool) that a graph capture cannot hold; the engine's lock serializes its runs."""
        cuda = self.device.type == "cuda"
        index = self.device.index if cuda else -1
        loader = getattr(getattr(self._torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
        if loader is not None and self.package_loader != "aoti_load_package":
            try:
                package = DirectPackage(loader(str(path), "model", True, 1, index))
                self.package_loader = "torch._C._aoti"
                return package
            except TypeError:  # another binding: the Python wrapper from now on
                self.package_loader = "aoti_load_package"
        return self._load_package_wrapped(path, index)

    def _load_package_wrapped(self, path: Path, index: int) -> Any:
        """``torch._inductor.aoti_load_package``, its CPU-ISA check primed first."""
        started = time.perf_counter()
        import torch._inductor
        from torch._inductor import cpu_vec_isa

        if self.cpu_isa is None:
            try:
                self.cpu_isa = prime_cpu_isa(cpu_vec_isa)
            except Exception as exc:  # a private module: the first load pays the probe then
                self.cpu_isa = f"not primed: {exc}"
            self.start_phases["isa"] = time.perf_counter() - started
        self.package_loader = "aoti_load_package"
        load = torch._inductor.aoti_load_package
        try:
            return load(str(path), run_single_threaded=True, device_index=index)
        except TypeError:
            return load(str(path), device_index=index)

    def _take_slot(self) -> StreamSlot | None:
        if not self._slots:
            return None
        slot = self._slots[self._next_slot % len(self._slots)]
        self._next_slot += 1
        return slot

    def _prepare(self, engine: TorchEngine, phases: dict[str, float]) -> None:
        """On the loader thread: profile, then capture the graphs."""
        phases["profile"] = engine.profile()
        if graphs_enabled() and engine._cuda:
            phases["graphs"] = engine.capture_graphs()

    def close(self) -> None:
        self._loader.close()
        self._ring = None  # the pinned buffers go back to torch's host cache

    def target(self, model: Any) -> EngineTarget:
        return EngineTarget(
            format="pt2",
            gpu_arch=self.gpu_arch,
            torch_version=self.torch_version,
            precision_preference=tuple(model.precisions),
        )

    def estimate_bytes(self, path: Path, descriptor: EngineDescriptor) -> int:
        return read_tidal_section(path).manifest.weights_bytes

    def load(
        self, path: Path, descriptor: EngineDescriptor, model: Any, available_bytes: int
    ) -> TorchEngine:
        torch = self._torch
        section = read_tidal_section(path)
        manifest = section.manifest
        cuda = self.device.type == "cuda"
        if (manifest.device == "cuda") != cuda:
            raise EngineLoadError(
                f"{descriptor.uri} was compiled for {manifest.device}, this backend runs on "
                f"{self.device.type}"
            )
        if cuda:
            free, _ = torch.cuda.mem_get_info(self.device)
            why_not = fits_free_memory(manifest.weights_bytes, int(free))
            if why_not is not None:
                raise EngineLoadError(f"model {model.name!r} refused: {why_not}")
        phases: dict[str, float] = {}
        engine: TorchEngine | None = None
        weights = None
        gate = self.gate.hold() if self.gate is not None else contextlib.nullcontext(0.0)
        try:
            started = time.perf_counter()
            try:
                compiled = self._loader.call(self._load_package, path)
            except Exception as exc:  # AOTI raises RuntimeError for ABI/arch mismatches
                raise EngineLoadError(f"cannot load {descriptor.uri}: {exc}") from None
            phases["deserialize"] = time.perf_counter() - started
            with gate as waited:
                if self.gate is not None:
                    phases["gate"] = waited
                started = time.perf_counter()
                if cuda:  # file -> pinned ring -> device, overlapped (backends/staging.py)
                    weights = torch.empty(
                        manifest.weights_bytes, dtype=torch.uint8, device=self.device
                    )
                    with self._stage_lock:
                        staging.stage_to_device(
                            torch,
                            path,
                            section.weights_offset,
                            weights,
                            self._staging_ring(manifest.weights_bytes),
                            torch.cuda.Stream(device=self.device),
                        )
                else:
                    weights = torch.empty(manifest.weights_bytes, dtype=torch.uint8)
                    read_into(path, section.weights_offset, memoryview(weights.numpy()))
                phases["stage"] = time.perf_counter() - started

                started = time.perf_counter()
                constants = {}
                for entry in manifest.constants:
                    tdtype = getattr(torch, entry.dtype)  # "bfloat16" has no numpy type
                    raw = weights[entry.offset : entry.offset + entry.nbytes]
                    constants[entry.fqn] = raw.view(tdtype).view(entry.shape)
                try:
                    compiled.load_constants(constants, check_full_update=True, user_managed=True)
                except TypeError:  # the C++ binding takes other arguments: the Python wrapper
                    if not isinstance(compiled, DirectPackage):
                        raise
                    self.package_loader = "aoti_load_package"
                    compiled = self._loader.call(self._load_package, path)
                    compiled.load_constants(constants, check_full_update=True, user_managed=True)
                phases["h2d"] = time.perf_counter() - started

                engine = TorchEngine(
                    torch,
                    compiled,
                    manifest,
                    self.device,
                    weights,
                    model.max_batch_size,
                    phases,
                    self._take_slot() if cuda else None,
                    self._device_lock,
                )
                self._loader.call(self._prepare, engine, phases)
            return engine
        except torch.OutOfMemoryError as exc:
            if engine is not None:
                engine.close()
            weights = None
            with self._device_lock:
                torch.cuda.empty_cache()
            raise EngineLoadError(
                f"model {model.name!r}: out of device memory while loading: {exc}"
            ) from None

    def device_memory(self) -> DeviceMemory | None:
        if self.device.type != "cuda":
            return None
        free, total = self._torch.cuda.mem_get_info(self.device)
        return DeviceMemory(total_bytes=int(total), used_bytes=int(total - free))

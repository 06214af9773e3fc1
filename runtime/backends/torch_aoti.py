"""PyTorch AOTInductor backend: ``.pt2`` packages compiled ahead of time, run on a CUDA GPU.

An AOTInductor package is the closest thing to a TensorRT plan that the machines here can both
build and run: kernels compiled for one GPU architecture, linked against one torch, loaded by
deserialization (``torch._inductor.aoti_load_package``).  It is named and bound like a plan
(``sm90-torch2.11-fp16.pt2``, see :mod:`tidal.runtime.core.engines`) and goes through the same
cold store, sha256 check and engine cache.

Package layout.  The compiled model is packaged *without* its weights
(``aot_inductor.package_constants_in_so=False``); :func:`add_tidal_section` appends to the same
zip a stored (uncompressed) ``<archive>/tidal/weights.bin`` — every constant, 256-byte aligned —
and ``<archive>/tidal/manifest.json`` — the constants' offsets, dtypes and shapes and the
model's input and output tensors.  So one file, one sha256, and the runtime controls how the
weights reach the device.  Loading, in timed phases (``Engine.load_phases``):

1. ``deserialize``: ``aoti_load_package`` (extracts and dlopens the compiled wrapper, whose
   constructor sets the CUDA device), always on the backend's one loader thread
   (:class:`DedicatedThread`, its device made current first), one load at a time, whichever
   worker thread of the engine cache asked.  (Added while a load segfaulted on the H200; that
   turned out not to depend on the thread but on how the wrapper was linked, see
   ``PACKAGE_INDUCTOR_CONFIGS``; bench/results/gpu_bench-h200-2026-12-04b.txt);
2. ``stage``: the weight blob is read from the file with parallel ``preadv`` straight into one
   page-locked (pinned) host buffer;
3. ``h2d``: one asynchronous copy into one device allocation on a CUDA stream of the load,
   then the constants are handed to the model as views of it (``load_constants(...,
   user_managed=True)``: no second copy);
4. ``profile``: one run at ``maxBatchSize`` with the allocator's peak reset, which measures the
   activation workspace the engine needs; the engine's ``size_bytes`` is weights + I/O buffers +
   that workspace, so the cache accounts for what the engine really takes.

Requests: the input rows are copied into pinned buffers, copied H2D on the engine's stream into
preallocated device buffers, the model runs on that stream, outputs come back D2H into pinned
buffers.  Closing an engine drops every device tensor and empties the caching allocator, so an
eviction frees real device memory (checked with ``cudaMemGetInfo`` in tests/gpu/).

Loads that cannot fit are refused with the reason (free bytes against needed bytes) before any
allocation; an out-of-memory error during a load becomes an :class:`EngineLoadError` after the
partial engine is freed.  Torch is imported on first use: this module imports without it, and
the manifest and layout code is tested in CI, which has neither torch nor a GPU.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tidal.runtime.backends import DeviceMemory, TensorSpec
from tidal.runtime.core.engines import EngineDescriptor, EngineTarget, parse_torch_version
from tidal.runtime.errors import BackendError, EngineLoadError

MANIFEST_NAME = "tidal/manifest.json"
WEIGHTS_NAME = "tidal/weights.bin"
ALIGN = 256
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


def layout_constants(
    constants: list[tuple[str, str, tuple[int, ...], int]],
) -> tuple[tuple[ConstantEntry, ...], int]:
    """Place ``(fqn, dtype, shape, nbytes)`` constants in one blob, each ``ALIGN``-aligned."""
    entries = []
    offset = 0
    for fqn, dtype, shape, nbytes in constants:
        entries.append(ConstantEntry(fqn, dtype, tuple(shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return tuple(entries), offset


def manifest_to_json(manifest: Pt2Manifest) -> str:
    def tensor(spec: TensorSpec) -> dict[str, Any]:
        return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}

    return json.dumps(
        {
            "version": MANIFEST_VERSION,
            "device": manifest.device,
            "torch": manifest.torch_version,
            "inputs": [tensor(s) for s in manifest.inputs],
            "outputs": [tensor(s) for s in manifest.outputs],
            "weightsBytes": manifest.weights_bytes,
            "constants": [
                {
                    "fqn": c.fqn,
                    "dtype": c.dtype,
                    "shape": list(c.shape),
                    "offset": c.offset,
                    "nbytes": c.nbytes,
                }
                for c in manifest.constants
            ],
        },
        indent=1,
    )


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
                str(np.dtype(c["dtype"])),
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
        if count * np.dtype(c.dtype).itemsize != c.nbytes:
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


def layout_blob(manifest: Pt2Manifest, weights: list[bytes]) -> bytearray:
    """The weight blob: each constant's bytes at its manifest offset."""
    blob = bytearray(manifest.weights_bytes)
    for entry, data in zip(manifest.constants, weights, strict=True):
        if len(data) != entry.nbytes:
            raise ValueError(f"{entry.fqn}: {len(data)}B given, the layout says {entry.nbytes}B")
        blob[entry.offset : entry.offset + entry.nbytes] = data
    return blob


def write_tidal_section(package: Path, manifest: Pt2Manifest, blob: bytes | bytearray) -> None:
    """Append the manifest and a laid-out weight blob (stored, uncompressed) to a ``.pt2``."""
    if len(blob) != manifest.weights_bytes:
        raise ValueError(f"a blob of {len(blob)}B, the manifest says {manifest.weights_bytes}B")
    with zipfile.ZipFile(package) as archive:
        prefix = _archive_prefix(archive.namelist())
    with zipfile.ZipFile(package, "a", compression=zipfile.ZIP_STORED) as archive:
        archive.writestr(prefix + MANIFEST_NAME, manifest_to_json(manifest))
        archive.writestr(prefix + WEIGHTS_NAME, bytes(blob))


def add_tidal_section(package: Path, manifest: Pt2Manifest, weights: list[bytes]) -> None:
    """Append the manifest and the weight blob (stored, aligned) to a ``.pt2`` zip."""
    write_tidal_section(package, manifest, layout_blob(manifest, weights))


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
    try:
        import torch
        import torch._inductor
    except ImportError as exc:
        raise EngineLoadError(
            f"the torch backend needs PyTorch (pip install 'tidal[torch]'): {exc}"
        ) from None
    return torch


class TorchEngine:
    """One loaded AOTInductor package with its weights, stream and I/O buffers."""

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
        self._stream = torch.cuda.Stream(device=device) if self._cuda else None
        self._lock = threading.Lock()
        self.inputs = manifest.inputs
        self.outputs = manifest.outputs
        self.max_batch_size = max_batch_size
        self.load_phases = load_phases
        self.weights_bytes = manifest.weights_bytes
        self.io_bytes = 0
        self.workspace_bytes = 0
        self._in_dev: list[Any] = []
        self._in_host: list[Any] = []
        self._in_host_np: list[np.ndarray[Any, Any]] = []  # numpy views of the pinned buffers
        self._out_host: list[Any] | None = None
        from tidal.runtime.protocol import DATATYPES

        self._np_types = [np.dtype(DATATYPES[s.datatype]) for s in self.inputs]
        if self._cuda:
            for spec, dtype in zip(self.inputs, self._np_types, strict=True):
                shape = [max_batch_size] + [d if d > 0 else 1 for d in spec.shape[1:]]
                tdtype = torch.from_numpy(np.empty(0, dtype)).dtype
                self._in_dev.append(torch.empty(shape, dtype=tdtype, device=device))
                self._in_host.append(torch.empty(shape, dtype=tdtype, pin_memory=True))
                self._in_host_np.append(self._in_host[-1].numpy())
                self.io_bytes += self._in_dev[-1].nbytes
        self.size_bytes = footprint_bytes(self.weights_bytes, self.io_bytes, self.workspace_bytes)

    def stream_handle(self) -> int:
        return int(self._stream.cuda_stream) if self._stream is not None else 0

    def profile(self) -> float:
        """Run once at ``max_batch_size``, measuring the activation workspace; returns seconds."""
        from tidal.runtime.backends import warmup_inputs

        torch = self._torch
        started = time.perf_counter()
        inputs = warmup_inputs(self, self.max_batch_size)
        with self._lock:
            if self._cuda:
                torch.cuda.synchronize(self._device)
                base = torch.cuda.memory_allocated(self._device)
                torch.cuda.reset_peak_memory_stats(self._device)
            self._out_host = None  # sized by this largest batch
            self._run(inputs)
            if self._cuda:
                peak = torch.cuda.max_memory_allocated(self._device)
                self.workspace_bytes = max(0, peak - base)
                self.size_bytes = footprint_bytes(
                    self.weights_bytes, self.io_bytes, self.workspace_bytes
                )
        return time.perf_counter() - started

    def infer(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        with self._lock:
            return self._run(inputs)

    def _run(self, inputs: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
        torch = self._torch
        arrays = [
            np.asarray(inputs[s.name], dtype=t)
            for s, t in zip(self.inputs, self._np_types, strict=True)
        ]
        rows = arrays[0].shape[0]
        if rows > self.max_batch_size:
            raise EngineLoadError(
                f"batch of {rows} rows exceeds maxBatchSize {self.max_batch_size}"
            )
        if self._compiled is None:
            raise BackendError("the engine was closed")
        if not self._cuda:
            results = self._compiled(*[torch.from_numpy(a) for a in arrays])
            outs = results if isinstance(results, list | tuple) else [results]
            return {s.name: o.detach().numpy() for s, o in zip(self.outputs, outs, strict=True)}
        assert self._stream is not None
        pairs = []  # (pinned host rows, device rows) of each input
        for array, host_np, host, dev in zip(
            arrays, self._in_host_np, self._in_host, self._in_dev, strict=True
        ):
            if array.shape[1:] == host_np.shape[1:]:  # the first `rows` rows of the buffers
                np.copyto(host_np[:rows], array, casting="no")
                pairs.append((host[:rows], dev[:rows]))
            else:  # other trailing dimensions (dynamic ones): the first elements, reshaped
                flat = host_np.reshape(-1)[: array.size].reshape(array.shape)
                np.copyto(flat, array, casting="no")
                pairs.append(
                    (
                        host.view(-1)[: array.size].view(array.shape),
                        dev.view(-1)[: array.size].view(array.shape),
                    )
                )
        with torch.cuda.stream(self._stream):
            for pinned, target in pairs:
                target.copy_(pinned, non_blocking=True)
            args = [target for _, target in pairs]
            if self._run_flat is not None:
                outs = self._run_flat(args)
            else:
                results = self._compiled(*args)
                outs = results if isinstance(results, list | tuple) else [results]
            if self._out_host is None or len(self._out_host) != len(outs):
                self._out_host = [
                    torch.empty(o.shape, dtype=o.dtype, pin_memory=True) for o in outs
                ]
            hosts = []
            for i, (out, host) in enumerate(zip(outs, self._out_host, strict=True)):
                if out.numel() > host.numel():
                    host = self._out_host[i] = torch.empty(
                        out.shape, dtype=out.dtype, pin_memory=True
                    )
                if out.shape[1:] == host.shape[1:]:
                    view = host[: out.shape[0]]
                else:
                    view = host.view(-1)[: out.numel()].view(out.shape)
                view.copy_(out, non_blocking=True)
                hosts.append(view)
        self._stream.synchronize()
        # Copies: the pinned buffers are reused by the next batch.
        return {s.name: h.numpy().copy() for s, h in zip(self.outputs, hosts, strict=True)}

    def close(self) -> None:
        torch = self._torch
        with self._lock:
            if self._stream is not None:
                self._stream.synchronize()
            self._compiled = self._run_flat = None
            if self._weights is not None:
                # Free the weights' memory now, whoever still refers to it: torch 2.11's
                # load_constants(user_managed=True) keeps a new tensor handle per constant that
                # it never releases, so dropping our references freed nothing (an eviction gave
                # 0 MiB back on the H200, bench/results/gpu_bench-h200-2026-12-04b.txt).  The
                # model that used those handles is gone with ``_compiled``.
                self._weights.untyped_storage().resize_(0)
            self._weights = None
            self._in_dev, self._in_host, self._in_host_np, self._out_host = [], [], [], None
        if self._cuda:
            torch.cuda.synchronize(self._device)
            # Not freed here: the cuBLAS workspace torch keeps per stream (tens of MiB, outside
            # the allocator's cache); clearing it would race with other engines' running
            # kernels.  The caller's reserve covers it.
            torch.cuda.empty_cache()


class TorchAOTIBackend:
    """Loads tidal ``.pt2`` packages with ``torch._inductor.aoti_load_package``."""

    name = "torch"

    def __init__(self, device: str | int = 0) -> None:
        self._torch = torch = import_torch()
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
        # Package loads run on this one thread (see the module's docstring, phase 1).
        try:
            self._loader = DedicatedThread(
                "tidal-aoti-load", LOADER_STACK_BYTES, self._make_device_current
            )
        except Exception as exc:  # the initializer failed: BrokenThreadPool
            raise EngineLoadError(
                f"the torch backend's loader thread did not start: {exc}"
            ) from None
        # The first package load of a process probes the CPU's vector ISA by compiling test
        # programs (seconds, whatever the device); pay that once here, not inside a cold load.
        try:
            from torch._inductor.cpu_vec_isa import pick_vec_isa

            pick_vec_isa()
        except Exception:  # a private helper; without it the first load pays the probe
            pass

    def _make_device_current(self) -> None:
        """On the loader thread: the backend's device current, its CUDA context made and used."""
        if self.device.type != "cuda":
            return
        torch = self._torch
        torch.cuda.set_device(self.device)
        torch.empty(1, device=self.device).zero_()
        torch.cuda.synchronize(self.device)

    def _load_package(self, path: Path) -> Any:
        cuda = self.device.type == "cuda"
        return self._torch._inductor.aoti_load_package(
            str(path), device_index=self.device.index if cuda else -1
        )

    def close(self) -> None:
        self._loader.close()

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
        staging = weights = None
        try:
            started = time.perf_counter()
            try:
                compiled = self._loader.call(self._load_package, path)
            except Exception as exc:  # AOTI raises RuntimeError for ABI/arch mismatches
                raise EngineLoadError(f"cannot load {descriptor.uri}: {exc}") from None
            phases["deserialize"] = time.perf_counter() - started

            started = time.perf_counter()
            staging = torch.empty(manifest.weights_bytes, dtype=torch.uint8, pin_memory=cuda)
            read_into(path, section.weights_offset, memoryview(staging.numpy()))
            phases["stage"] = time.perf_counter() - started

            started = time.perf_counter()
            if cuda:
                stream = torch.cuda.Stream(device=self.device)
                with torch.cuda.stream(stream):
                    weights = torch.empty(
                        manifest.weights_bytes, dtype=torch.uint8, device=self.device
                    )
                    weights.copy_(staging, non_blocking=True)
                stream.synchronize()
            else:
                weights = staging
            constants = {}
            for entry in manifest.constants:
                tdtype = torch.from_numpy(np.empty(0, np.dtype(entry.dtype))).dtype
                raw = weights[entry.offset : entry.offset + entry.nbytes]
                constants[entry.fqn] = raw.view(tdtype).view(entry.shape)
            compiled.load_constants(constants, check_full_update=True, user_managed=True)
            phases["h2d"] = time.perf_counter() - started
            staging = None  # the pinned blob goes back to torch's host cache

            engine = TorchEngine(
                torch, compiled, manifest, self.device, weights, model.max_batch_size, phases
            )
            phases["profile"] = engine.profile()
            return engine
        except torch.OutOfMemoryError as exc:
            if engine is not None:
                engine.close()
            staging = weights = None
            torch.cuda.empty_cache()
            raise EngineLoadError(
                f"model {model.name!r}: out of device memory while loading: {exc}"
            ) from None

    def device_memory(self) -> DeviceMemory | None:
        if self.device.type != "cuda":
            return None
        free, total = self._torch.cuda.mem_get_info(self.device)
        return DeviceMemory(total_bytes=int(total), used_bytes=int(total - free))


_NUMPY_NAMES: dict[Any, str] = {}


@dataclass
class PreparedPackage:
    """A model exported and laid out, not yet compiled: see :func:`build_package`."""

    exported: Any
    path: Path  # where the package goes (its name is the binding)
    manifest: Pt2Manifest
    weights: list[bytes]  # each constant's bytes, in the manifest's order


def prepare_package(
    torch: Any,
    module: Any,
    example_inputs: tuple[Any, ...],
    input_names: list[str],
    output_names: list[str],
    out_dir: Path,
    *,
    precision: str,
    max_batch_size: int,
) -> PreparedPackage:
    """Export ``module`` (batch dimension dynamic up to ``max_batch_size``) and lay out its
    constants; nothing is compiled yet."""
    from tidal.runtime.core.engines import pt2_file_name
    from tidal.runtime.protocol import datatype_of

    for name in ("float16", "float32", "float64", "int8", "int32", "int64", "uint8", "bool"):
        _NUMPY_NAMES[getattr(torch, name)] = name

    device = example_inputs[0].device
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm{major}{minor}"
    else:
        arch = "cpu"
    batch = torch.export.Dim("batch", min=1, max=max_batch_size)
    exported = torch.export.export(
        module,
        example_inputs,
        dynamic_shapes=tuple({0: batch} for _ in example_inputs),
    )
    with torch.no_grad():
        results = module(*example_inputs)
    outs = results if isinstance(results, list | tuple) else [results]

    def spec(name: str, tensor: Any) -> TensorSpec:
        dtype = np.dtype(_NUMPY_NAMES[tensor.dtype])
        return TensorSpec(name, datatype_of(dtype), (-1, *tensor.shape[1:]))

    signature = exported.graph_signature
    state = {**exported.state_dict, **exported.constants}
    fqns = [*signature.parameters, *signature.buffers]
    tensors = [state[f].detach().contiguous().cpu() for f in fqns]
    layout, total = layout_constants(
        [
            (f, str(np.dtype(_NUMPY_NAMES[t.dtype])), tuple(t.shape), t.numel() * t.element_size())
            for f, t in zip(fqns, tensors, strict=True)
        ]
    )
    manifest = Pt2Manifest(
        inputs=tuple(spec(n, t) for n, t in zip(input_names, example_inputs, strict=True)),
        outputs=tuple(spec(n, t) for n, t in zip(output_names, outs, strict=True)),
        constants=layout,
        weights_bytes=total,
        device=device.type,
        torch_version=torch.__version__,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    # The file name is the binding (one folder per model, as for TensorRT plans).
    path = out_dir / pt2_file_name(arch, parse_torch_version(torch.__version__), precision)
    weights = [t.view(torch.uint8).numpy().tobytes() for t in tensors]
    return PreparedPackage(exported, path, manifest, weights)


# Inductor settings for every package.  ``custom_op_libs: [":libstdc++.so.6"]`` puts
# ``-l:libstdc++.so.6`` on the wrapper library's link line, so that it links the shared
# libstdc++ the process already has.  On the H200 image $CXX (which inductor compiles with) is
# a g++ whose library folder has libstdc++.a and no libstdc++.so: the wrapper came out with
# libstdc++'s own code inside it and none in its NEEDED entries, and every load of such a
# package (constants in the .so or not, on any thread) segfaulted in std::regex in the model's
# constructor (parse_device_str); a plain ``-lstdc++`` changed nothing, this flag made them
# load and run (bench/results/gpu_bench-h200-2026-12-04b.txt).
PACKAGE_INDUCTOR_CONFIGS: dict[str, Any] = {
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.custom_op_libs": [":libstdc++.so.6"],
}


def compile_package(
    torch: Any, prepared: PreparedPackage, overrides: dict[str, Any] | None = None
) -> None:
    """AOTInductor-compile the exported program into ``prepared.path``, without its weights
    (``PACKAGE_INDUCTOR_CONFIGS``, updated with ``overrides``)."""
    torch._inductor.aoti_compile_and_package(
        prepared.exported,
        package_path=str(prepared.path),
        inductor_configs={**PACKAGE_INDUCTOR_CONFIGS, **(overrides or {})},
    )


def build_package(
    torch: Any,
    module: Any,
    example_inputs: tuple[Any, ...],
    input_names: list[str],
    output_names: list[str],
    out_dir: Path,
    *,
    precision: str,
    max_batch_size: int,
    progress: Any = None,
) -> Path:
    """Export, compile and package ``module`` as ``<arch>-torch<ver>-<precision>.pt2``.

    Three steps (:func:`prepare_package`, :func:`compile_package`, :func:`add_tidal_section`),
    which a caller may also run one by one (bench/gpu_bench.py keeps the prepared weights on
    disk so that a build process that dies after the compile can be finished by another).  The
    batch dimension of every input is dynamic up to ``max_batch_size``; the weights go into the
    tidal section, not the compiled library.  The constants' names come from the exported
    program (parameters, then buffers), not from loading the fresh package (the load path
    checks them: ``load_constants(check_full_update=True)``).  ``progress(str)`` is told each
    step's duration as it ends.  Returns the package's path.
    """
    started = time.perf_counter()

    def step(what: str) -> None:
        if progress is not None:
            progress(f"{what} at {time.perf_counter() - started:.1f} s")

    prepared = prepare_package(
        torch,
        module,
        example_inputs,
        input_names,
        output_names,
        out_dir,
        precision=precision,
        max_batch_size=max_batch_size,
    )
    step(f"exported; {len(prepared.weights)} constants copied to the host")
    compile_package(torch, prepared)
    step(f"compiled and packaged ({prepared.path.stat().st_size} B, no weights)")
    add_tidal_section(prepared.path, prepared.manifest, prepared.weights)
    step(f"weights appended ({prepared.manifest.weights_bytes} B)")
    return prepared.path

"""The runtime's torch (AOTInductor) backend on a real GPU: throughput, cold loads, cache churn.

Run on the device machine (see runtime/README.md); every figure is measured in the same run:

  python bench/gpu_bench.py build --model mlp DIR    # compile a small MLP package (batch <= 64)
  python bench/gpu_bench.py build --model big DIR    # compile a ~1 GiB (fp16) weight-heavy one
  python bench/gpu_bench.py finish --model mlp DIR   # append the weights, if build died after
                                                     # compiling (it leaves them in DIR first)
  python bench/gpu_bench.py run DIR [--seconds S]    # every section below, time-boxed
  python bench/gpu_bench.py diag --variant V DIR     # load DIR's mlp package one way (V) and
                                                     # run it once: which load paths work

bench/gpu_device_run.sh is the whole device call (each step its own process, faulthandler on,
every line time-stamped; SIGUSR1 dumps every thread's stack, as the script's timeouts send).

Sections of ``run``: (1) the pinned host->device copy limit of this machine; (2) throughput and
P50/P99 at batch 1/8/64 of the runtime backend (numpy in, numpy out, through pinned buffers on
the engine's stream) against a direct in-process call of the same compiled package, with host
tensors (the same work: ceiling) and with device-resident tensors (compute only); (3) cold load
of the big package through the engine cache, per phase, and H2D bandwidth against (1); hot vs
cold request latency; (4) cache churn under a Zipf load over more models than fit the budget,
with ``cudaMemGetInfo`` read after every eviction; (5) eviction gives the memory back.
``build`` also writes ``<model>.ref.npz`` (an input and the eager model's output) for
tests/gpu/.  Figures only; nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import itertools
import json
import os
import shutil
import signal
import statistics
import sys
import threading
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tidal.runtime.backends.torch_aoti import (  # noqa: E402
    LOADER_STACK_BYTES,
    DedicatedThread,
    TorchAOTIBackend,
    parse_manifest,
    read_tidal_section,
)
from tidal.runtime.builder.pt2 import (  # noqa: E402
    compile_package,
    layout_blob,
    manifest_to_json,
    prepare_package,
    write_tidal_section,
)

BEGAN = time.perf_counter()


def log(text: str) -> None:
    """A time-stamped line (UTC, and seconds since this process started), flushed at once."""
    now = datetime.now(UTC).strftime("%H:%M:%S")
    print(f"[{now} +{time.perf_counter() - BEGAN:.1f}s] {text}", flush=True)


MODELS = {
    # name: (input width, hidden widths, output width, max batch)
    "mlp": (512, [1024, 1024], 128, 64),
    "big": (8192, [8192] * 7, 8192, 8),  # 8 layers of 8192x8192 fp16: ~1 GiB of weights
}


def make_module(torch: Any, name: str, width: int | None = None) -> Any:
    width_in, hidden, width_out, _ = MODELS[name]
    if width is not None:  # a narrower copy, to try the bench on a CPU
        width_in, hidden, width_out = width, [width] * len(hidden), width
    layers: list[Any] = []
    widths = [width_in, *hidden, width_out]
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class Device:
    """CUDA when torch sees it, else the CPU (to try this script on a machine without a GPU)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.cuda = bool(torch.cuda.is_available())
        self.np_dtype = np.float16 if self.cuda else np.float32

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def free(self) -> int:
        return int(self.torch.cuda.mem_get_info()[0]) if self.cuda else 0

    def put(self, tensor: Any) -> Any:
        return tensor.cuda(non_blocking=True) if self.cuda else tensor

    def empty_cache(self) -> None:
        if self.cuda:
            self.torch.cuda.empty_cache()


def input_width(path: Path) -> int:
    return read_tidal_section(path).manifest.inputs[0].shape[1]


def pending_paths(out_dir: Path, name: str) -> tuple[Path, Path]:
    return out_dir / f"{name}.pending.json", out_dir / f"{name}.pending.bin"


def cmd_build(
    name: str, out_dir: Path, width: int | None = None, overrides: dict[str, Any] | None = None
) -> None:
    """Export, then keep the laid-out weights on disk, compile, append them.

    The weights and manifest are written to ``<name>.pending.{json,bin}`` before compiling, so
    that a build process that dies after the compile (on the H200, 2026-12-03, both did with
    SIGSEGV, cause unknown) leaves what ``finish`` needs to complete the package.
    """
    log(f"build {name}: importing torch")
    import torch

    log(f"build {name}: torch {torch.__version__}, cuda {torch.cuda.is_available()}")
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    precision = "fp16" if device.type == "cuda" else "fp32"
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    with torch.device(device):  # initialise the weights where they live (1 GiB on a CPU is slow)
        module = make_module(torch, name, width).to(dtype=dtype).eval()
    width_in, _, _, max_batch = MODELS[name]
    width_in = width or width_in
    x = torch.randn(min(4, max_batch), width_in, device=device, dtype=dtype)
    with torch.no_grad():
        y = module(x)
    np.savez(out_dir / f"{name}.ref.npz", x=x.cpu().numpy(), y=y.cpu().numpy())
    log(f"build {name}: module made, reference output saved; exporting")
    started = time.perf_counter()
    prepared = prepare_package(
        torch,
        module,
        (x,),
        ["x"],
        ["y"],
        out_dir / name,
        precision=precision,
        max_batch_size=max_batch,
    )
    blob = layout_blob(prepared.manifest, prepared.weights)
    prepared.weights.clear()
    meta, data = pending_paths(out_dir, name)
    data.write_bytes(blob)
    meta.write_text(
        json.dumps({"path": str(prepared.path), "manifest": manifest_to_json(prepared.manifest)})
    )
    log(
        f"build {name}: exported, {len(prepared.manifest.constants)} constants "
        f"({len(blob)} B) kept in {data.name}; compiling (aoti_compile_and_package)"
    )
    if overrides:
        log(f"build {name}: inductor config overrides {json.dumps(overrides)}")
    compile_package(torch, prepared, overrides)
    log(f"build {name}: compiled and packaged, {prepared.path.stat().st_size} B without weights")
    # The package as torch wrote it, before the tidal section: 'diag --variant bare' loads it.
    shutil.copyfile(prepared.path, out_dir / f"{name}.bare.pt2")
    write_tidal_section(prepared.path, prepared.manifest, blob)
    log(f"build {name}: weights appended")
    finished(name, out_dir, prepared.path, time.perf_counter() - started)


def finished(name: str, out_dir: Path, path: Path, took: float) -> None:
    (out_dir / f"{name}.path").write_text(str(path.relative_to(out_dir)))
    for pending in pending_paths(out_dir, name):
        pending.unlink(missing_ok=True)
    size = path.stat().st_size
    log(f"build {name}: {path.name} {size / 2**20:.1f} MiB, export+compile+package {took:.1f} s")


def cmd_finish(name: str, out_dir: Path) -> None:
    """Complete a package whose build process died after compiling it."""
    meta, data = pending_paths(out_dir, name)
    if (out_dir / f"{name}.path").is_file():
        log(f"finish {name}: already built")
        return
    if not meta.is_file():
        log(f"finish {name}: nothing pending (the build died before its weights were kept)")
        raise SystemExit(1)
    started = time.perf_counter()
    pending = json.loads(meta.read_text())
    path, manifest = Path(pending["path"]), parse_manifest(pending["manifest"])
    if not path.is_file():
        log(f"finish {name}: {path} was not written (the build died before the compile ended)")
        raise SystemExit(1)
    write_tidal_section(path, manifest, data.read_bytes())
    log(f"finish {name}: weights appended to the package the build process left")
    finished(name, out_dir, path, time.perf_counter() - started)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_calls(call: Any, seconds: float, sync: Any) -> list[float]:
    for _ in range(5):
        call()
    sync()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(latencies) < 20:
        started = time.perf_counter()
        call()
        sync()
        latencies.append(time.perf_counter() - started)
    return latencies


def pinned_copy_limit(torch: Any) -> float:
    nbytes = 1 << 30
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    rates = []
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        dev.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(nbytes / (time.perf_counter() - started) / 1e9)
    del host, dev
    torch.cuda.empty_cache()
    rate = statistics.median(rates)
    print(f"[1] pinned H2D copy 1 GiB: median {rate:.1f} GB/s (max {max(rates):.1f}) of 5")
    return rate


def make_config(
    models: dict[str, Path], budget: int, max_batch: dict[str, int], *, sha256: bool = False
) -> Any:
    """Models that load on demand; ``sha256``: the store verifies each file on every fetch."""
    from tidal.runtime.config import parse_config
    from tidal.runtime.storage import sha256_file

    digests = {p: sha256_file(p) for p in set(models.values())} if sha256 else {}

    return parse_config(
        {
            "models": [
                {
                    "name": name,
                    "engines": [{"uri": str(path), "sha256": digests.get(path)}],
                    "maxBatchSize": max_batch[name],
                    "preload": False,
                    "warmup": {"batchSizes": [1], "iterations": 1},
                }
                for name, path in models.items()
            ],
            "memory": {"engineCacheBudgetBytes": budget},
            "maxConcurrentLoads": 1,
        }
    )


def make_cache(config: Any, backend: Any) -> Any:
    from tidal.common.clock import CLOCK
    from tidal.runtime.enginecache import EngineCache
    from tidal.runtime.metrics import RuntimeMetrics
    from tidal.runtime.storage import EngineStore

    return EngineCache(config, backend, EngineStore(None), RuntimeMetrics(), CLOCK)


def section_throughput(dev: Device, backend: Any, path: Path, seconds: float) -> None:
    """The engine with its CUDA graphs and the same engine run eagerly (graphs off at its load)
    against the direct calls of the same package, all in this process."""
    torch = dev.torch
    width_in, max_batch = input_width(path), MODELS["mlp"][3]
    config = make_config(
        {"mlp": path, "mlp_eager": path}, 8 << 30, dict.fromkeys(["mlp", "mlp_eager"], max_batch)
    )
    cache = make_cache(config, backend)

    async def load(name: str) -> Any:
        engine, _ = await cache.acquire(name)
        cache.release(name)
        return engine

    engine = asyncio.run(load("mlp"))
    previous = os.environ.get("TIDAL_TORCH_CUDA_GRAPHS")
    os.environ["TIDAL_TORCH_CUDA_GRAPHS"] = "0"
    try:
        eager = asyncio.run(load("mlp_eager"))
    finally:
        if previous is None:
            os.environ.pop("TIDAL_TORCH_CUDA_GRAPHS")
        else:
            os.environ["TIDAL_TORCH_CUDA_GRAPHS"] = previous
    # The direct call: the same package, loaded by torch alone (on the backend's loader thread,
    # like the engine's), weights from the same file; called from this thread like the engine.
    section = read_tidal_section(path)
    direct = backend._loader.call(torch._inductor.aoti_load_package, str(path))
    blob = dev.put(torch.from_numpy(np.fromfile(path, dtype=np.uint8)))
    base = section.weights_offset
    constants = {
        c.fqn: blob[base + c.offset : base + c.offset + c.nbytes]
        .clone()  # the blob's offset in the zip need not be aligned for the dtype
        .view(torch.float16 if c.dtype == "float16" else torch.float32)
        .view(c.shape)
        for c in section.manifest.constants
    }
    direct.load_constants(constants, check_full_update=True, user_managed=True)
    sync = dev.sync
    print(f"[2] {path.name}: first load's phases {json.dumps(engine.load_phases)}")
    print(
        f"    graphs: {len(getattr(engine, 'graph_batch_sizes', []))} batch sizes captured, "
        f"{getattr(engine, 'graph_bytes', 0) / 2**20:.2f} MiB in their pool, error "
        f"{getattr(engine, 'graph_error', None)!r}; eager twin: graphs "
        f"{len(getattr(eager, 'graph_batch_sizes', []))}"
    )
    ref = read_ref(path)
    if ref is not None:
        for name, eng in (("graphs", engine), ("eager", eager)):
            got = eng.infer({"x": ref["x"]})["y"].astype(np.float32)
            err = float(np.abs(got - ref["y"].astype(np.float32)).max())
            print(f"    {name}: max abs error vs the eager torch model {err:.3g}")
    x64 = np.zeros((64, width_in), dtype=dev.np_dtype)
    timed_calls(lambda: engine.infer({"x": x64}), 0.3, sync)  # clocks up before measuring
    timed_calls(lambda: direct(dev.put(torch.from_numpy(x64))), 0.3, sync)
    # Two direct baselines, host tensors in and out: the public call (AOTICompiledModel
    # .__call__, which parses the call spec and flattens its arguments on every call) and the
    # package loader's run (a list in, a list out), the entry point the runtime's engine uses.
    print(
        "    batch | runtime(graphs) rows/s  P50 ms  P99 ms | runtime(eager) rows/s  P50  P99 |"
        " direct(__call__) rows/s  P50 | direct(loader.run) rows/s  P50  P99 | graphs/loader.run"
        " | eager/loader.run | graphs/__call__ | direct(device-resident) rows/s"
    )
    for batch in (1, 8, 64):
        x = np.random.default_rng(batch).standard_normal((batch, width_in)).astype(dev.np_dtype)
        ours = timed_calls(lambda x=x: engine.infer({"x": x}), seconds, sync)
        ours_eager = timed_calls(lambda x=x: eager.infer({"x": x}), seconds, sync)

        def host_call(x: np.ndarray[Any, Any] = x) -> None:
            out = direct(dev.put(torch.from_numpy(x)))
            out = out[0] if isinstance(out, list | tuple) else out
            out.cpu().numpy()

        def loader_call(x: np.ndarray[Any, Any] = x) -> None:
            direct.loader.run([dev.put(torch.from_numpy(x))])[0].cpu().numpy()

        theirs = timed_calls(host_call, seconds, sync)
        flat = timed_calls(loader_call, seconds, sync)
        xd = dev.put(torch.from_numpy(x))
        resident = timed_calls(lambda xd=xd: direct(xd), seconds, sync)
        ours_rate = batch / statistics.mean(ours)
        eager_rate = batch / statistics.mean(ours_eager)
        theirs_rate = batch / statistics.mean(theirs)
        flat_rate = batch / statistics.mean(flat)
        print(
            f"    {batch:5d} | {ours_rate:22.0f} {ms(ours, 0.5):7.3f} {ms(ours, 0.99):7.3f} | "
            f"{eager_rate:21.0f} {ms(ours_eager, 0.5):.3f} {ms(ours_eager, 0.99):.3f} | "
            f"{theirs_rate:23.0f} {ms(theirs, 0.5):.3f} | {flat_rate:25.0f} {ms(flat, 0.5):.3f} "
            f"{ms(flat, 0.99):.3f} | {ours_rate / flat_rate:17.1%} | {eager_rate / flat_rate:16.1%}"
            f" | {ours_rate / theirs_rate:15.1%} | {batch / statistics.mean(resident):.0f}"
        )
    cache.close()
    constants.clear()
    dev.empty_cache()


def ms(values: list[float], q: float) -> float:
    return percentile(values, q) * 1e3


def read_ref(path: Path) -> Any:
    """The <model>.ref.npz that build wrote beside the package's folder, if any."""
    for folder in (path.parent.parent, path.parent):
        for ref in folder.glob("*.ref.npz"):
            data = np.load(ref)
            if data["x"].shape[1] == input_width(path):
                return data
    return None


def phase_sums(metrics: Any, model: str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.name != "tidal_engine_load_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_sum") and sample.labels.get("model") == model:
                sums[sample.labels["phase"]] = sample.value
    return sums


def section_cold_load(dev: Device, backend: Any, path: Path, limit: float) -> None:
    width_in, max_batch = input_width(path), MODELS["big"][3]
    config = make_config({"big": path}, 8 << 30, {"big": max_batch}, sha256=True)
    cache = make_cache(config, backend)
    x = np.random.default_rng(0).standard_normal((1, width_in)).astype(dev.np_dtype)

    async def request() -> tuple[float, bool]:
        started = time.perf_counter()
        engine, cold = await cache.acquire("big")
        try:
            engine.infer({"x": x})
        finally:
            cache.release("big")
        return time.perf_counter() - started, cold

    async def requests() -> tuple[float, bool, list[float], int, int]:
        free_before = dev.free()
        cold_s, cold = await request()
        free_loaded = dev.free()
        hot = [(await request())[0] for _ in range(50)]
        return cold_s, cold, hot, free_before, free_loaded

    cold_s, cold, hot, free_before, free_loaded = asyncio.run(requests())
    engine = cache.slot("big").engine
    phases = engine.load_phases
    weights = engine.weights_bytes
    stage_rate = weights / phases["stage"] / 1e9
    total = sum(phase_sums(cache.metrics, "big").values())
    print(f"[3] cold load of {path.name}: {weights / 2**30:.2f} GiB of weights")
    print(
        "    tidal_engine_load_seconds by phase: "
        + json.dumps({k: round(v, 4) for k, v in phase_sums(cache.metrics, "big").items()})
    )
    print(
        f"    stage (file -> pinned ring -> device, overlapped; issue 46): {stage_rate:.1f} GB/s "
        f"= {stage_rate / limit:.0%} of the pinned copy limit {limit:.1f} GB/s; binding the "
        f"constants (h2d phase) {phases['h2d'] * 1e3:.1f} ms"
    )
    print(f"    whole load (every phase, sha256 included): {weights / total / 1e9:.2f} GB/s")
    print(
        f"    engine size {engine.size_bytes / 2**20:.1f} MiB (weights "
        f"{weights / 2**20:.1f}, I/O {engine.io_bytes / 2**20:.2f}, workspace measured at "
        f"batch {max_batch} {engine.workspace_bytes / 2**20:.2f}); cudaMemGetInfo free fell by "
        f"{(free_before - free_loaded) / 2**20:.1f} MiB"
    )
    print(
        f"    request latency: cold {cold_s * 1e3:.1f} ms (cold={cold}); hot P50 "
        f"{percentile(hot, 0.5) * 1e3:.3f} ms, P99 {percentile(hot, 0.99) * 1e3:.3f} ms"
    )
    asyncio.run(cache.unload("big"))
    free_after = dev.free()
    print(
        f"[5] unload: cudaMemGetInfo free {free_loaded / 2**30:.3f} -> {free_after / 2**30:.3f} "
        f"GiB (before load {free_before / 2**30:.3f}); {(free_after - free_loaded) / 2**20:.1f}"
        " MiB given back"
    )
    cache.close()


class PeakSampler:
    """Reads cudaMemGetInfo every ``period_s`` on its own thread: the device's peak use."""

    def __init__(self, dev: Device, period_s: float = 0.0005) -> None:
        self.dev = dev
        self.period_s = period_s
        self.base_free = dev.free()
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-sampler", daemon=True)

    def sample(self) -> None:
        self.peak = max(self.peak, self.base_free - self.dev.free())
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(self.period_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sample()


def churn(
    dev: Device,
    backend: Any,
    path: Path,
    budget: int,
    requests: int,
    seconds: float,
    concurrency: int,
    seed: int = 7,
) -> dict[str, Any]:
    """Zipf(1.1) requests over six models of ``path``, ``concurrency`` at a time (each infer on
    its own thread, batch 1..8), with cudaMemGetInfo sampled all along.  Returns the figures."""
    torch = dev.torch
    names = [f"m{i}" for i in range(6)]
    config = make_config(dict.fromkeys(names, path), budget, dict.fromkeys(names, 8))
    dev.sync()
    dev.empty_cache()
    cache = make_cache(config, backend)
    rng = np.random.default_rng(seed)
    weights = np.array([1 / (i + 1) ** 1.1 for i in range(len(names))])
    picks = rng.choice(len(names), size=requests, p=weights / weights.sum())
    sizes = rng.integers(1, 9, size=requests)
    width = input_width(path)
    xs = {b: np.zeros((b, width), dtype=dev.np_dtype) for b in range(1, 9)}
    latencies: dict[bool, list[float]] = {True: [], False: []}
    counts = {"retried": 0, "failed": 0}
    torch.cuda.reset_peak_memory_stats()
    from tidal.runtime.errors import Overloaded

    async def one(name: str, x: np.ndarray[Any, Any]) -> None:
        started = time.perf_counter()
        for _ in range(200):
            try:
                engine, cold = await cache.acquire(name)
            except Overloaded:  # every resident engine busy: the client retries
                counts["retried"] += 1
                await asyncio.sleep(0.005)
                continue
            try:
                await asyncio.to_thread(engine.infer, {"x": x})
            finally:
                cache.release(name)
            latencies[cold].append(time.perf_counter() - started)
            return
        counts["failed"] += 1

    async def run(sampler: PeakSampler) -> int:
        done = 0
        deadline = time.perf_counter() + seconds
        for start in range(0, requests, concurrency):
            if time.perf_counter() > deadline:
                break
            group = range(start, min(requests, start + concurrency))
            results = await asyncio.gather(
                *(one(names[picks[i]], xs[int(sizes[i])]) for i in group),
                return_exceptions=True,
            )
            for result in results:
                if isinstance(result, BaseException):
                    counts["failed"] += 1
                    print(f"    request failed: {type(result).__name__}: {result}")
            sampler.sample()
            done += len(group)
        return done

    with PeakSampler(dev) as sampler:
        done = asyncio.run(run(sampler))
    evictions = sum(
        s.value
        for f in cache.metrics.registry.collect()
        if f.name == "tidal_engine_cache_evictions"
        for s in f.samples
        if s.name.endswith("_total")
    )
    result = {
        "done": done,
        "concurrency": concurrency,
        "budget": budget,
        "cache_budget": cache.budget,
        "overhead": cache.overhead_bytes,
        "peak_above_start": sampler.peak,
        "samples": sampler.samples,
        "allocator_peak_reserved": torch.cuda.max_memory_reserved(),
        "resident_end": cache.resident_bytes(),
        "hot": latencies[False],
        "cold": latencies[True],
        "evictions": evictions,
        **counts,
    }
    cache.close()
    return result


def print_churn(label: str, r: dict[str, Any]) -> None:
    hot, cold = r["hot"], r["cold"]
    gib = 2**30
    total = r["peak_above_start"] + r["overhead"]
    print(
        f"[4] churn {label}: {r['done']} requests ({r['concurrency']} at a time, batch 1-8), "
        f"Zipf(1.1) over 6 models, budget {r['budget'] / gib:.2f} GiB (engines get "
        f"{r['cache_budget'] / gib:.2f}, backend overhead {r['overhead'] / 2**20:.0f} MiB): hit "
        f"ratio {len(hot) / max(1, len(hot) + len(cold)):.0%}, {len(cold)} cold loads, "
        f"{r['evictions']:.0f} evictions, {r['retried']} busy-retries, {r['failed']} failed"
    )
    if hot and cold:
        print(
            f"    cold P50 {ms(cold, 0.5):.1f} ms P99 {ms(cold, 0.99):.1f} ms; hot P50 "
            f"{ms(hot, 0.5):.3f} ms P99 {ms(hot, 0.99):.3f} ms"
        )
    print(
        f"    peak device memory above the start {r['peak_above_start'] / gib:.3f} GiB "
        f"({r['samples']} cudaMemGetInfo samples) + backend overhead held before it "
        f"{r['overhead'] / gib:.3f} = {total / gib:.3f} GiB against the budget "
        f"{r['budget'] / gib:.3f}: {'WITHIN' if total <= r['budget'] else 'OVER'} "
        f"({(r['budget'] - total) / 2**20:+.0f} MiB); allocator peak reserved "
        f"{r['allocator_peak_reserved'] / gib:.3f} GiB; resident at the end "
        f"{r['resident_end'] / gib:.2f} GiB"
    )


def section_churn(dev: Device, backend: Any, path: Path, requests: int, seconds: float) -> None:
    weights = read_tidal_section(path).manifest.weights_bytes
    budget = int(weights * 3.3)
    for label, concurrency, cap in (
        ("sequential, accounting only", 1, False),
        ("4 concurrent, accounting only", 4, False),
        ("4 concurrent, accounting + allocator cap", 4, True),
    ):
        if cap:
            backend.limit_device_memory(budget)
        try:
            print_churn(label, churn(dev, backend, path, budget, requests, seconds, concurrency))
        finally:
            if cap:
                backend.limit_device_memory(None)


def cmd_run(pkg_dir: Path, seconds: float, sections: str) -> None:
    log("run: importing torch")
    import torch

    log("run: torch imported")
    dev = Device(torch)
    if dev.cuda:
        print(
            f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
            f"free/total {[round(v / 2**30, 2) for v in torch.cuda.mem_get_info()]} GiB"
        )
    else:
        print(f"torch {torch.__version__}, no CUDA device: CPU trial run, figures mean nothing")
    backend = TorchAOTIBackend(0 if dev.cuda else "cpu")
    log("run: backend ready")
    print(
        "backend start phases (s): "
        + json.dumps({k: round(v, 3) for k, v in backend.start_phases.items()})
        + f"; cpu ISA {backend.cpu_isa!r}; {len(backend._slots)} stream slots, cuBLAS "
        f"workspaces {backend.workspace_bytes / 2**20:.1f} MiB, overhead "
        f"{backend.overhead_bytes / 2**20:.1f} MiB"
    )
    print(f"backend target: {backend.target(type('M', (), {'precisions': []})())}")
    limit = pinned_copy_limit(torch) if dev.cuda else float("nan")
    built = {
        m: pkg_dir / (pkg_dir / f"{m}.path").read_text().strip()
        for m in MODELS
        if (pkg_dir / f"{m}.path").is_file()
    }
    mlp, big = built.get("mlp"), built.get("big")
    for name in sections.split(","):
        started = time.perf_counter()
        log(f"section {name}: start")
        needs = mlp if name == "throughput" else big
        try:
            if needs is None:
                print(f"section {name} SKIPPED: its package was not built")
            elif name == "throughput":
                section_throughput(dev, backend, needs, seconds)
            elif name == "cold":
                section_cold_load(dev, backend, needs, limit)
            elif name == "churn":
                section_churn(dev, backend, needs, 120, 6 * seconds + 10)
        except Exception as exc:  # report and go on to the next section
            print(f"section {name} FAILED: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stdout)
            dev.empty_cache()
        log(f"section {name}: done in {time.perf_counter() - started:.1f} s")
    log("run: all sections done")


DIAG_VARIANTS = {
    "info": "the package's entries, the wrapper library's ldd, the stack limits; no load",
    "main": "load + constants + one run on the main thread, device_index=-1",
    "main-dev0": "the same with device_index=0",
    "thread": "the same on a new plain thread (the main thread has used CUDA first)",
    "thread-primed": "a new plain thread that first sets the device and runs a CUDA op",
    "thread-bigstack": f"a new plain thread, {LOADER_STACK_BYTES >> 20} MiB stack, no priming",
    "dedicated": "the backend's own loader thread (DedicatedThread, primed, big stack)",
    "bare": "main thread, the package as torch wrote it (no tidal section appended)",
    "inso": "a small model compiled WITH its constants in the .so, loaded on the main thread",
}


def diag_info(torch: Any, path: Path) -> None:
    import resource
    import subprocess
    import tempfile
    import zipfile

    soft, hard = resource.getrlimit(resource.RLIMIT_STACK)
    print(
        f"RLIMIT_STACK soft {soft} hard {hard} (-1 = unlimited); threading.stack_size "
        f"{threading.stack_size()}"
    )
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            print(f"  {info.file_size:>12d} {info.compress_type} {info.filename}")
        sos = [n for n in archive.namelist() if n.endswith(".so")]
        meta = [n for n in archive.namelist() if n.endswith("_metadata.json")]
        for name in meta:
            print(f"{name}: {archive.read(name).decode()[:600]}")
        with tempfile.TemporaryDirectory() as tmp:
            for name in sos:
                target = archive.extract(name, tmp)
                for command in (
                    ["ldd", target],
                    ["readelf", "-d", target],
                    ["readelf", "-p", ".comment", target],
                    ["sh", "-c", f"nm -C --defined-only {target} | grep -c 'std::locale'"],
                    ["sh", "-c", f"nm -C --defined-only {target} | grep -m3 'codecvt<char16_t'"],
                ):
                    out = subprocess.run(command, capture_output=True, text=True, check=False)
                    print(f"$ {' '.join(command[:2])} {name}:\n{out.stdout}{out.stderr}")


def diag_load_and_run(
    torch: Any, path: Path, ref: Any, device_index: int, load: Path | None = None
) -> None:
    """aoti_load_package (of ``load``, default ``path``), the tidal constants from ``path``,
    one run against the reference."""
    section = read_tidal_section(path)
    where = threading.current_thread().name
    load = load or path
    log(f"diag: aoti_load_package({load.name}, device_index={device_index}) on {where}")
    started = time.perf_counter()
    compiled = torch._inductor.aoti_load_package(str(load), device_index=device_index)
    log(f"diag: loaded in {time.perf_counter() - started:.3f} s; reading constants")
    blob = np.fromfile(
        path, dtype=np.uint8, count=section.manifest.weights_bytes, offset=section.weights_offset
    )
    weights = torch.from_numpy(blob).cuda()
    constants = {
        c.fqn: weights[c.offset : c.offset + c.nbytes]
        .view(torch.float16 if c.dtype == "float16" else torch.float32)
        .view(c.shape)
        for c in section.manifest.constants
    }
    compiled.load_constants(constants, check_full_update=True, user_managed=True)
    log("diag: constants loaded; first run")
    x = torch.from_numpy(ref["x"]).cuda()
    out = compiled(x)
    out = out[0] if isinstance(out, list | tuple) else out
    torch.cuda.synchronize()
    err = float((out.float().cpu() - torch.from_numpy(ref["y"]).float()).abs().max())
    log(f"diag: RAN: output {tuple(out.shape)} {out.dtype}, max abs error vs eager {err:.3g}")


def diag_inso(torch: Any, out_dir: Path) -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    module = module.to("cuda", torch.float16).eval()
    x = torch.randn(4, 64, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        y = module(x)
    batch = torch.export.Dim("batch", min=1, max=16)
    exported = torch.export.export(module, (x,), dynamic_shapes=({0: batch},))
    path = out_dir / "inso.pt2"
    log("diag inso: compiling with the constants in the .so")
    torch._inductor.aoti_compile_and_package(exported, package_path=str(path))
    log(f"diag inso: {path.stat().st_size} B; aoti_load_package on the main thread")
    compiled = torch._inductor.aoti_load_package(str(path))
    out = compiled(x)
    out = out[0] if isinstance(out, list | tuple) else out
    torch.cuda.synchronize()
    log(f"diag inso: RAN, max abs error vs eager {float((out - y).abs().max()):.3g}")


def cmd_diag(pkg_dir: Path, variant: str) -> None:
    """One way of loading and running the mlp package; run each in its own process (a
    segfault ends only that one).  Every step is logged before it starts."""
    log(f"diag {variant}: {DIAG_VARIANTS[variant]}; importing torch")
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda").zero_()  # the main thread has used CUDA, as in the bench
    torch.cuda.synchronize()
    path = pkg_dir / (pkg_dir / "mlp.path").read_text().strip()
    ref = np.load(pkg_dir / "mlp.ref.npz")
    if variant == "info":
        diag_info(torch, path)
        return
    if variant == "inso":
        diag_inso(torch, pkg_dir)
        return
    if variant.startswith("main"):
        diag_load_and_run(torch, path, ref, 0 if variant == "main-dev0" else -1)
        return
    if variant == "bare":
        diag_load_and_run(torch, path, ref, -1, pkg_dir / "mlp.bare.pt2")
        return
    if variant == "dedicated":

        def prime() -> None:
            torch.cuda.set_device(0)
            torch.empty(1, device="cuda").zero_()
            torch.cuda.synchronize()

        loader = DedicatedThread("diag-loader", LOADER_STACK_BYTES, prime)
        loader.call(diag_load_and_run, torch, path, ref, 0)
        return
    failure: list[BaseException] = []

    def body() -> None:
        try:
            if variant == "thread-primed":
                torch.cuda.set_device(0)
                torch.empty(1, device="cuda").zero_()
                torch.cuda.synchronize()
                log("diag: device set and a CUDA op run on this thread")
            diag_load_and_run(torch, path, ref, -1)
        except BaseException as exc:
            failure.append(exc)

    if variant == "thread-bigstack":
        threading.stack_size(LOADER_STACK_BYTES)
    thread = threading.Thread(target=body, name=f"diag-{variant}")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build")
    build.add_argument("--model", choices=sorted(MODELS), required=True)
    build.add_argument("--width", type=int, help="every layer this wide (a CPU trial)")
    build.add_argument(
        "--inductor-config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="override one of torch_aoti.PACKAGE_INDUCTOR_CONFIGS (repeatable)",
    )
    build.add_argument("dir", type=Path)
    finish = sub.add_parser("finish")
    finish.add_argument("--model", choices=sorted(MODELS), required=True)
    finish.add_argument("dir", type=Path)
    diag = sub.add_parser("diag")
    diag.add_argument("--variant", choices=sorted(DIAG_VARIANTS), required=True)
    diag.add_argument("dir", type=Path)
    run = sub.add_parser("run")
    run.add_argument("dir", type=Path)
    run.add_argument("--seconds", type=float, default=1.5, help="timed seconds per measurement")
    run.add_argument("--sections", default="throughput,cold,churn")
    args = parser.parse_args()
    # A hang shows where it is: SIGUSR1 (bench/gpu_device_run.sh's timeouts send it) dumps
    # every thread's stack; run with ``python -X faulthandler`` for crashes too.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    args.dir.mkdir(parents=True, exist_ok=True)
    code = 0
    try:
        if args.command == "build":
            overrides = {
                key: json.loads(value)
                for key, value in (item.split("=", 1) for item in args.inductor_config)
            }
            cmd_build(args.model, args.dir, args.width, overrides)
        elif args.command == "finish":
            cmd_finish(args.model, args.dir)
        elif args.command == "diag":
            cmd_diag(args.dir, args.variant)
        else:
            cmd_run(args.dir, args.seconds, args.sections)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        code = 1
    # Leave without the interpreter's teardown: on the H200 a finished bench process did not
    # exit within 45 s (2026-12-03).  Everything is written and flushed by now.
    log(f"{args.command}: exiting with {code}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()

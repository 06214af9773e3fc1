"""Engine bytes to the GPU, and weight streaming on the torch backend, against peers (issue 46).

  python3 bench/gpu_weights_bench.py facts DIR
  python3 bench/gpu_weights_bench.py stage DIR [--gib 10]
  python3 bench/gpu_weights_bench.py stream [--layers 32 --dim 8192]

``facts``: which peer loaders import, and the disk's read rate (``dd`` of a file written in DIR,
the page cache dropped first).  ``stage``: one safetensors file of ``--gib`` GiB in DIR (fp16
tensors of 256 MiB), then, each hot (the file in the page cache) and cold (``echo 3 >
/proc/sys/vm/drop_caches`` first; needs root), on the same file in the same run: ``dd`` to
/dev/null (the baseline: what the disk or the page cache gives), tidal's staging
(:mod:`tidal.runtime.backends.staging`: parallel preadv into a pinned ring, overlapped H2D) without
verification, with the per-chunk sha256 (every core) and with one whole-file sha256 (one core),
``safetensors.torch.load_file(device="cuda")``, Run:ai Model Streamer and fastsafetensors
(where they import).  Each prints GB/s and its ratio to ``dd`` of the same state, and the time
to a first answer (the file's bytes on the device as tensors + one matmul on the last tensor).

``stream``: a model of ``--layers`` fp16 layers (Linear(dim, dim) + ReLU) run by
:class:`tidal.runtime.backends.streaming.StreamedLayers` with 100/75/50/25 % of its weights
resident, at batch 1/8/64: throughput, P99, peak device memory against the plan's budget,
streamed GB/s against the pinned H2D limit measured in the same run (one 1 GiB pinned copy), and
Hugging Face accelerate's ``cpu_offload`` of the same non-resident layers (same model, same
resident set) where it imports.  Figures only (harness figures: no assertions).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GB = 1e9


def drop_caches() -> bool:
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError as exc:
        print(f"    (cannot drop the page cache: {exc})")
        return False


def dd_rate(path: Path) -> float:
    started = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M"], check=True, capture_output=True)
    return path.stat().st_size / (time.perf_counter() - started) / GB


def cmd_facts(folder: Path) -> None:
    for name in (
        "runai_model_streamer",
        "fastsafetensors",
        "safetensors",
        "accelerate",
        "cufile",
        "kvikio",
        "obstore",
        "pydantic",
    ):
        try:
            module = importlib.import_module(name)
            print(f"import {name}: ok {getattr(module, '__version__', '')}")
        except Exception as exc:  # any failure is a fact to print
            print(f"import {name}: FAILED {type(exc).__name__}: {exc}")
    with contextlib.suppress(Exception):
        out = subprocess.run(
            [sys.executable, "-m", "pip", "show", "nvidia-cufile"], capture_output=True, text=True
        )
        print("pip show nvidia-cufile:", " ".join(out.stdout.split("\n")[:2]))
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / "dd-probe.bin"
    subprocess.run(
        ["dd", "if=/dev/urandom", f"of={probe}", "bs=16M", "count=128", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    print(f"dd hot  {probe.stat().st_size / GB:.2f} GB: {dd_rate(probe):.2f} GB/s")
    if drop_caches():
        print(f"dd cold {probe.stat().st_size / GB:.2f} GB: {dd_rate(probe):.2f} GB/s")
    probe.unlink()
    print(subprocess.run(["df", "-h", str(folder)], capture_output=True, text=True).stdout)


def write_safetensors(path: Path, gib: float) -> dict[str, Any]:
    """A safetensors file of fp16 [8192, 16384] tensors (256 MiB each), distinct bytes each."""
    import numpy as np

    count = max(1, round(gib * 4))
    shape = [8192, 16384]
    each = 8192 * 16384 * 2
    header: dict[str, Any] = {}
    for i in range(count):
        header[f"w{i:03d}"] = {
            "dtype": "F16",
            "shape": shape,
            "data_offsets": [i * each, (i + 1) * each],
        }
    text = json.dumps(header).encode()
    text += b" " * (-(len(text) + 8) % 256)
    rng = np.random.default_rng(46)
    base = rng.standard_normal(each // 2, dtype=np.float32).astype(np.float16)
    with path.open("wb") as out:
        out.write(len(text).to_bytes(8, "little"))
        out.write(text)
        for i in range(count):
            block = base.copy()
            block[:4096] = i  # each tensor differs
            out.write(block.tobytes())
        out.flush()
        os.fsync(out.fileno())
    return {"header": header, "data_offset": 8 + len(text), "data_bytes": count * each}


def cmd_stage(folder: Path, gib: float) -> None:
    import torch

    from tidal.runtime.backends import staging

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "weights.safetensors"
    started = time.perf_counter()
    layout = write_safetensors(path, gib)
    size = path.stat().st_size
    print(
        f"file: {size / GB:.2f} GB ({size / 2**30:.2f} GiB), written in "
        f"{time.perf_counter() - started:.1f} s; cores {os.cpu_count()}"
    )
    started = time.perf_counter()
    digests = staging.chunk_sha256_file(path)
    print(
        f"builder: per-chunk sha256 ({len(digests.sha256)} chunks of 64 MiB) in "
        f"{time.perf_counter() - started:.2f} s (file hot, every core)"
    )
    started = time.perf_counter()
    whole = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(64 << 20):
            whole.update(block)
    whole_s = time.perf_counter() - started
    print(
        f"builder: whole-file sha256 in {whole_s:.2f} s ({size / whole_s / GB:.2f} GB/s, one core)"
    )
    sample = bytes(256 << 20)
    for algorithm in ("sha256", "blake2b"):
        started = time.perf_counter()
        hashlib.new(algorithm, sample).digest()
        rate = len(sample) / (time.perf_counter() - started) / GB
        print(f"hashlib {algorithm} of 256 MiB in memory, one core: {rate:.2f} GB/s")
    device = torch.device("cuda", 0)
    torch.cuda.init()
    threads = staging.default_threads()
    started = time.perf_counter()
    ring = staging.PinnedRing(torch, staging.ring_buffers_for(threads))
    print(
        f"pinned ring: {ring.nbytes / 2**20:.0f} MiB made once in "
        f"{time.perf_counter() - started:.2f} s (per backend, not per load)"
    )
    stream = torch.cuda.Stream(device=device)
    header = layout["header"]
    last = sorted(header)[-1]

    def first_answer(tensors: dict[str, Any]) -> None:
        w = tensors[last]
        x = torch.ones(1, w.shape[0], dtype=w.dtype, device=device)
        (x @ w).sum().item()

    def views(blob: Any) -> dict[str, Any]:
        return {
            name: blob[m["data_offsets"][0] : m["data_offsets"][1]]
            .view(torch.float16)
            .view(m["shape"])
            for name, m in header.items()
        }

    def tidal(mode: str) -> Callable[[], dict[str, Any]]:
        def load() -> dict[str, Any]:
            blob = torch.empty(layout["data_bytes"], dtype=torch.uint8, device=device)
            staging.stage_to_device(
                torch,
                path,
                layout["data_offset"],
                blob,
                ring,
                stream,
                digests=digests if mode == "chunks" else None,
                whole_sha256=whole.hexdigest() if mode == "whole" else None,
                threads=threads,
            )
            return views(blob)

        return load

    def st_load() -> dict[str, Any]:
        from safetensors.torch import load_file

        return load_file(str(path), device="cuda:0")

    def runai_load() -> dict[str, Any]:
        from runai_model_streamer import SafetensorsStreamer

        out = {}
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(str(path))
            for name, tensor in streamer.get_tensors():
                out[name] = tensor.to(device, non_blocking=True)
        torch.cuda.synchronize()
        return out

    def fst_load(nogds: bool) -> Callable[[], dict[str, Any]]:
        def load() -> dict[str, Any]:
            from fastsafetensors import fastsafe_open

            out = {}
            with fastsafe_open(filenames=[str(path)], nogds=nogds, device="cuda:0") as f:
                for name in f.keys():  # noqa: SIM118 - its own API
                    out[name] = f.get_tensor(name).clone()
            torch.cuda.synchronize()
            return out

        return load

    loaders: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("tidal staging, no verification", tidal("none")),
        ("tidal staging, per-chunk sha256 (every core)", tidal("chunks")),
        ("tidal staging, one whole-file sha256 (one core)", tidal("whole")),
        ("safetensors.torch.load_file(device=cuda)", st_load),
        ("runai-model-streamer 0.17.1", runai_load),
        ("fastsafetensors (nogds)", fst_load(True)),
        ("fastsafetensors (GDS)", fst_load(False)),
    ]
    results: dict[str, dict[str, float]] = {}
    for state in ("hot", "cold"):
        where = "in the page cache" if state == "hot" else "dropped from the page cache before each"
        print(f"=== {state}: the file {where}")
        if state == "hot":
            dd_rate(path)  # warm the cache
            base = dd_rate(path)
        else:
            if not drop_caches():
                break
            base = dd_rate(path)
        print(f"  dd if=file of=/dev/null bs=16M: {base:.2f} GB/s (baseline)")
        results.setdefault("dd", {})[state] = base
        for name, load in loaders:
            if state == "cold":
                drop_caches()
            else:
                dd_rate(path)
            torch.cuda.synchronize()
            started = time.perf_counter()
            try:
                tensors = load()
                torch.cuda.synchronize()
                loaded = time.perf_counter() - started
                first_answer(tensors)
                answered = time.perf_counter() - started
            except Exception as exc:  # a peer that fails here is a fact to print
                print(f"  {name}: FAILED {type(exc).__name__}: {str(exc)[:300]}")
                continue
            finally:
                tensors = {}
                torch.cuda.empty_cache()
            rate = layout["data_bytes"] / loaded / GB
            results.setdefault(name, {})[state] = rate
            print(
                f"  {name}: {rate:.2f} GB/s = {rate / base:.2f}x dd; weights on the GPU in "
                f"{loaded:.2f} s, first answer at {answered:.2f} s"
            )
    print("=== summary (GB/s; the ratio to the best peer of the same state)")
    for state in ("hot", "cold"):
        peers = [
            v[state] for k, v in results.items() if state in v and ("runai" in k or "fastsafe" in k)
        ]
        best = max(peers, default=0.0)
        ours = results.get("tidal staging, per-chunk sha256 (every core)", {}).get(state)
        if ours is not None and best:
            print(
                f"  {state}: tidal verified {ours:.2f} vs best peer {best:.2f} = "
                f"{ours / best:.2f}x; vs dd {ours / results['dd'][state]:.2f}x"
            )
    print(json.dumps({"stage_gbps": results, "gib": gib}))
    path.unlink()


def make_layers(torch: Any, count: int, dim: int, device: Any = None) -> list[Any]:
    """The same layers every call (seeded; made on ``device``: initialising 4 GiB on the CPU
    would take most of the step)."""
    torch.manual_seed(46)
    layers = []
    for _ in range(count):
        linear = torch.nn.Linear(dim, dim, dtype=torch.float16, device=device)
        with torch.no_grad():
            linear.weight.mul_(1.0 / (dim**0.5) * 3)
        layers.append(torch.nn.Sequential(linear, torch.nn.ReLU()))
    return layers


def timed(torch: Any, fn: Callable[[], Any], iters: int) -> tuple[float, float]:
    """(mean seconds per call, P99 seconds) over ``iters`` calls, after 2 warm-up calls."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    times.sort()
    return sum(times) / len(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def cmd_stream(count: int, dim: int, iters: int, accelerate_too: bool) -> None:
    import torch

    from tidal.runtime.backends.streaming import StreamedLayers, layer_nbytes
    from tidal.runtime.core.weightstreaming import plan_layer_residency

    device = torch.device("cuda", 0)
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    for _ in range(3):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(5):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    pinned_limit = 5 * (1 << 30) / (time.perf_counter() - started) / GB
    del host, dev
    torch.cuda.empty_cache()
    print(f"pinned H2D limit (1 GiB copies, same run): {pinned_limit:.1f} GB/s")
    layers0 = make_layers(torch, count, dim, "meta")
    sizes = [layer_nbytes(layer) for layer in layers0]
    total = sum(sizes)
    print(f"model: {count} x (Linear({dim},{dim}) fp16 + ReLU) = {total / 2**30:.2f} GiB")
    reference: dict[int, Any] = {}
    results = []
    for fraction in (1.0, 0.75, 0.5, 0.25):
        for batch in (1, 8, 64):
            reserve = 64 << 20
            budget = (
                int(total * fraction) + 2 * max(sizes) + reserve
                if fraction < 1
                else total + reserve
            )
            plan = plan_layer_residency(sizes, budget, reserve)
            seed = torch.Generator(device).manual_seed(batch)
            x = torch.randn(batch, dim, dtype=torch.float16, device=device, generator=seed)
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated(device)
            layers = make_layers(torch, count, dim, device)
            model = StreamedLayers(torch, layers, plan, device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            with torch.no_grad():
                out = model(x)
                mean, p99 = timed(torch, functools.partial(model, x), iters)
            peak = torch.cuda.max_memory_allocated(device) - before
            if fraction == 1.0:
                reference[batch] = out.float().cpu()
            same = torch.equal(out.float().cpu(), reference[batch])
            streamed = model.streamed_bytes_per_pass / mean / GB
            row = {
                "resident": fraction,
                "batch": batch,
                "layers_resident": plan.resident,
                "ms": mean * 1e3,
                "p99_ms": p99 * 1e3,
                "rows_per_s": batch / mean,
                "streamed_gbps": streamed,
                "of_pinned": streamed / pinned_limit,
                "peak_gib": peak / 2**30,
                "budget_gib": budget / 2**30,
                "equal_to_resident": same,
            }
            model.close()
            model = layers = out = None  # nothing of this pass may count in the next one's peak
            torch.cuda.empty_cache()
            if accelerate_too and fraction < 1.0:
                try:
                    from accelerate import cpu_offload

                    layers = make_layers(torch, count, dim, device)
                    for layer in layers[: plan.resident]:
                        layer.to(device)
                    for layer in layers[plan.resident :]:
                        cpu_offload(layer, execution_device=device)
                    seq = torch.nn.Sequential(*layers)
                    with torch.no_grad():
                        amean, _ = timed(torch, functools.partial(seq, x), max(3, iters // 4))
                    row["accelerate_ms"] = amean * 1e3
                    row["ours_vs_accelerate"] = amean / mean
                    del seq, layers
                    torch.cuda.empty_cache()
                except Exception as exc:
                    row["accelerate_error"] = f"{type(exc).__name__}: {exc}"[:200]
            results.append(row)
            print(
                f"  resident {fraction:>4.0%} ({plan.resident:>2}/{count} layers) "
                f"batch {batch:>2}: "
                f"{mean * 1e3:7.2f} ms/pass (P99 {p99 * 1e3:7.2f}), {batch / mean:9.0f} rows/s, "
                f"streamed {streamed:5.1f} GB/s = {streamed / pinned_limit:.2f} of pinned; peak "
                f"{peak / 2**30:.2f} GiB <= budget {budget / 2**30:.2f} GiB: {peak <= budget}; "
                f"equal to resident: {same}"
                + (
                    f"; accelerate cpu_offload {row['accelerate_ms']:.1f} ms = "
                    f"{row['ours_vs_accelerate']:.1f}x ours"
                    if "accelerate_ms" in row
                    else ""
                )
                + (f"; accelerate: {row['accelerate_error']}" if "accelerate_error" in row else "")
            )
    print(json.dumps({"pinned_gbps": pinned_limit, "rows": results}))


def cmd_stream_one(count: int, dim: int, fraction: float, batch: int, iters: int) -> None:
    """One streamed model in this process (for ``pair``): the first pass (cold: nothing
    prefetched, the allocator and kernels fresh) and every later pass's seconds, as JSON."""
    import torch

    from tidal.runtime.backends.streaming import StreamedLayers, layer_nbytes
    from tidal.runtime.core.weightstreaming import plan_layer_residency

    device = torch.device("cuda", 0)
    sizes = [layer_nbytes(layer) for layer in make_layers(torch, count, dim, "meta")]
    reserve = 64 << 20
    budget = int(sum(sizes) * fraction) + 2 * max(sizes) + reserve
    model = StreamedLayers(
        torch,
        make_layers(torch, count, dim, device),
        plan_layer_residency(sizes, budget, reserve),
        device,
    )
    x = torch.randn(batch, dim, dtype=torch.float16, device=device)
    torch.cuda.synchronize()
    print("ready", flush=True)
    sys.stdin.readline()  # the parent starts every process's passes at once
    times = []
    with torch.no_grad():
        for _ in range(iters):
            started = time.perf_counter()
            model(x)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
    print(json.dumps({"first_s": times[0], "times": times[1:]}), flush=True)


def cmd_pair(count: int, dim: int, fraction: float, batch: int, iters: int) -> None:
    """One streamed model alone, then two at once (each its own process, same GPU): each one's
    P50/P99 per pass against alone, and the cold first pass against the hot ones."""

    def run(n: int) -> list[dict[str, Any]]:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "stream-one",
                    "--layers",
                    str(count),
                    "--dim",
                    str(dim),
                    "--fraction",
                    str(fraction),
                    "--batch",
                    str(batch),
                    "--iters",
                    str(iters),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(n)
        ]
        for proc in procs:
            assert proc.stdout is not None
            while proc.stdout.readline().strip() != "ready":
                pass
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        out = []
        for proc in procs:
            text, _ = proc.communicate()
            out.append(json.loads(text.strip().splitlines()[-1]))
        return out

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))]

    alone = run(1)[0]
    a50, a99 = pct(alone["times"], 0.5), pct(alone["times"], 0.99)
    print(
        f"one streamed model alone ({fraction:.0%} resident, batch {batch}): first pass "
        f"{alone['first_s'] * 1e3:.1f} ms (cold), then P50 {a50 * 1e3:.1f} ms "
        f"P99 {a99 * 1e3:.1f} ms"
    )
    for i, each in enumerate(run(2)):
        p50, p99 = pct(each["times"], 0.5), pct(each["times"], 0.99)
        print(
            f"two at once, model {i}: P50 {p50 * 1e3:.1f} ms P99 {p99 * 1e3:.1f} ms = "
            f"{p99 / a99:.2f}x alone's P99 (goal <= 1.5x); "
            f"first pass {each['first_s'] * 1e3:.1f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    facts = sub.add_parser("facts")
    facts.add_argument("dir", type=Path)
    stage = sub.add_parser("stage")
    stage.add_argument("dir", type=Path)
    stage.add_argument("--gib", type=float, default=10.0)
    stream = sub.add_parser("stream")
    stream.add_argument("--layers", type=int, default=32)
    stream.add_argument("--dim", type=int, default=8192)
    stream.add_argument("--iters", type=int, default=20)
    stream.add_argument("--no-accelerate", action="store_true")
    for name in ("stream-one", "pair"):
        one = sub.add_parser(name)
        one.add_argument("--layers", type=int, default=32)
        one.add_argument("--dim", type=int, default=8192)
        one.add_argument("--fraction", type=float, default=0.5)
        one.add_argument("--batch", type=int, default=8)
        one.add_argument("--iters", type=int, default=60)
    args = parser.parse_args()
    if args.cmd == "facts":
        cmd_facts(args.dir)
    elif args.cmd == "stage":
        cmd_stage(args.dir, args.gib)
    elif args.cmd == "stream":
        cmd_stream(args.layers, args.dim, args.iters, not args.no_accelerate)
    elif args.cmd == "stream-one":
        cmd_stream_one(args.layers, args.dim, args.fraction, args.batch, args.iters)
    else:
        cmd_pair(args.layers, args.dim, args.fraction, args.batch, args.iters)


if __name__ == "__main__":
    main()

"""Where a GPU replica's start goes (issue 34): the torch backend's start in a fresh process,
phase by phase, and the runtime CLI's own time to ready.

Run on the device machine after ``bench/gpu_bench.py build`` filled DIR (bench/gpu_device_run.sh
does both):

  TIDAL_T0_NS=$(date +%s%N) python3 bench/gpu_start.py phases --mode after DIR
      # each phase timed: interpreter, imports, CUDA context, cuda-python, the backend's
      # streams, the first package load of each model (per load phase), a raw 1 GiB pinned
      # allocation; --mode before adds what the code before issue 34 paid in every process:
      # importing torch._inductor and inductor's CPU-ISA check (compiler and Python
      # subprocesses)
  python3 bench/gpu_start.py server [--root TREE] DIR
      # ``python -m tidal.runtime`` (of TREE, default this checkout) with the mlp model
      # preloaded: seconds from the spawn to /v2/health/live and to /v2/health/ready, then one
      # infer request over HTTP

Figures only; nothing here asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

T0 = int(os.environ.get("TIDAL_T0_NS", "0")) / 1e9 or time.time()
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def stamp(phases: dict[str, float], name: str, since: float) -> float:
    now = time.perf_counter()
    phases[name] = now - since
    print(f"[+{time.time() - T0:7.3f}s] {name}: {phases[name]:.3f} s", flush=True)
    return now


def package(folder: Path, model: str) -> Path:
    return folder / (folder / f"{model}.path").read_text().strip()


def cmd_phases(folder: Path, mode: str) -> None:
    phases: dict[str, float] = {}
    phases["interpreter (exec to main)"] = time.time() - T0
    print(f"[+{phases['interpreter (exec to main)']:7.3f}s] interpreter started", flush=True)
    t = time.perf_counter()
    import numpy as np

    from tidal.common.clock import CLOCK
    from tidal.runtime.config import parse_config
    from tidal.runtime.enginecache import EngineCache
    from tidal.runtime.metrics import RuntimeMetrics
    from tidal.runtime.storage import EngineStore

    t = stamp(phases, "import numpy + tidal.runtime", t)
    import torch

    t = stamp(phases, "import torch", t)
    if mode == "before":
        import torch._inductor

        t = stamp(phases, "import torch._inductor", t)
    torch.cuda.set_device(0)
    torch.cuda.init()
    torch.empty(1, device="cuda").zero_()
    torch.cuda.synchronize()
    t = stamp(phases, "CUDA context (set_device, init, first kernel)", t)
    from tidal.runtime.backends import cudamem

    cudamem.mem_get_info()
    t = stamp(phases, "cuda-python init (import cuda.bindings, cudaMemGetInfo)", t)
    from tidal.runtime.backends.torch_aoti import TorchAOTIBackend

    if mode == "before":
        from torch._inductor import cpu_vec_isa

        name = str(cpu_vec_isa.pick_vec_isa())  # inductor's own check, as before issue 34
        t = stamp(phases, f"CPU-ISA check (inductor's probe: {name})", t)
    backend = TorchAOTIBackend(0)
    t = stamp(phases, "TorchAOTIBackend() (streams, cuBLAS workspaces; torch and CUDA ready)", t)
    print(f"    backend.start_phases {json.dumps(backend.start_phases)}")
    models = {m: package(folder, m) for m in ("mlp", "big") if (folder / f"{m}.path").is_file()}
    config = parse_config(
        {
            "models": [
                {
                    "name": m,
                    "engines": [{"uri": str(p)}],
                    "maxBatchSize": 64 if m == "mlp" else 8,
                    "preload": False,
                    "warmup": {"batchSizes": [1], "iterations": 1},
                }
                for m, p in models.items()
            ],
            "memory": {"engineCacheBudgetBytes": 8 << 30},
            "maxConcurrentLoads": 1,
        }
    )
    cache = EngineCache(config, backend, EngineStore(None), RuntimeMetrics(), CLOCK)
    t = stamp(phases, "EngineCache()", t)
    for model in models:

        async def load(name: str = model) -> Any:
            engine, _ = await cache.acquire(name)
            cache.release(name)
            return engine

        engine = asyncio.run(load())
        t = stamp(phases, f"first load of {model} (every phase)", t)
        print(
            f"    {model} load phases "
            + json.dumps({k: round(v, 4) for k, v in engine.load_phases.items()})
            + f"; graphs {len(engine.graph_batch_sizes)} ({engine.graph_error!r}); loaded by "
            f"{backend.package_loader}; torch._inductor imported: "
            f"{'torch._inductor' in sys.modules}"
        )
        x = np.zeros((1, engine.inputs[0].shape[1]), dtype=np.float16)
        engine.infer({"x": x})
        t = stamp(phases, f"first request to {model}", t)
        if model == "mlp":
            phases["ready with mlp (exec to here)"] = time.time() - T0
            ready = phases["ready with mlp (exec to here)"]
            print(f"    a replica serving mlp would be ready {ready:.3f} s after exec")
    allocator = cudamem.DeviceAllocator()
    buffer = allocator.alloc_pinned(1 << 30)
    t = stamp(phases, "pinned host allocation, 1 GiB (cudaMallocHost, outside torch's cache)", t)
    allocator.free_pinned(buffer)
    cache.close()
    print("PHASES " + json.dumps({k: round(v, 4) for k, v in phases.items()}), flush=True)
    sys.stdout.flush()
    os._exit(0)


def get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except Exception:
        return 0


def cmd_server(folder: Path, root: Path, seconds: float) -> None:
    mlp = package(folder, "mlp")
    port = 18000 + os.getpid() % 1000
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "runtime.json"
        cfg.write_text(
            json.dumps(
                {
                    "backend": "torch",
                    "models": [
                        {
                            "name": "mlp",
                            "engines": [{"uri": str(mlp)}],
                            "maxBatchSize": 64,
                            "preload": True,
                        }
                    ],
                    "memory": {"engineCacheBudgetBytes": 2 << 30},
                }
            )
        )
        env = {
            **os.environ,
            "PYTHONPATH": f"{root}:{os.environ.get('PYTHONPATH', '')}",
            "TIDAL_GRPC_PORT": "0",
            "PYTHONUNBUFFERED": "1",
        }
        log_path = Path(tmp) / "server.log"
        started = time.time()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tidal.runtime",
                    "--config",
                    str(cfg),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                cwd=root,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            live = ready = None
            base = f"http://127.0.0.1:{port}"
            while time.time() - started < seconds and proc.poll() is None:
                if live is None and get(f"{base}/v2/health/live") == 200:
                    live = time.time() - started
                if get(f"{base}/v2/health/ready") == 200:
                    ready = time.time() - started
                    break
                time.sleep(0.02)
            status = -1
            if ready is not None:
                body = json.dumps(
                    {
                        "inputs": [
                            {
                                "name": "x",
                                "datatype": "FP16",
                                "shape": [1, 512],
                                "data": [0.0] * 512,
                            }
                        ]
                    }
                ).encode()
                request = urllib.request.Request(
                    f"{base}/v2/models/mlp/infer",
                    data=body,
                    headers={"Content-Type": "application/json"},
                )
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        status = int(response.status)
                except Exception as exc:
                    print(f"    infer failed: {exc}")
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        print(
            f"server ({root}): live after {live if live is None else round(live, 3)} s, ready "
            f"after {ready if ready is None else round(ready, 3)} s (exit {proc.returncode}); "
            f"one infer over HTTP: {status}"
        )
        lines = log_path.read_text(errors="replace").splitlines()
        for line in [ln for ln in lines if "Warning" not in ln][-12:]:
            print(f"    | {line[:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    phases = sub.add_parser("phases")
    phases.add_argument("--mode", choices=["before", "after"], default="after")
    phases.add_argument("dir", type=Path)
    server = sub.add_parser("server")
    server.add_argument("--root", type=Path, default=ROOT)
    server.add_argument("--seconds", type=float, default=120)
    server.add_argument("dir", type=Path)
    args = parser.parse_args()
    if args.command == "phases":
        cmd_phases(args.dir, args.mode)
    else:
        cmd_server(args.dir, args.root.resolve(), args.seconds)


if __name__ == "__main__":
    main()

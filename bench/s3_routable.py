"""A new replica's time to routable with its engine in S3: an empty node cache against a warm one.

Starts the sandbox's object store (versitygw, `make sandbox-binaries`, as bench/s3_fetch_bench.py
does) on 127.0.0.1, puts one ONNX MLP per `--mib` size in a bucket (`tidal.runtime.modelgen`,
float32 weights of about that many MiB), and for each size and each of `--rounds` rounds starts
the real runtime (`python -m tidal.runtime`, one process per start) twice:

* `cold`: the node's engine cache (`cacheDir`) is a new, empty directory: the engine is streamed
  from the store, hashed and written there;
* `warm`: a directory holding the engine the first round's cold start left: the fetch phase is
  the cached file's sha256 check only.

Each start is timed from the spawn by the wall clock (`live`: /v2/health/live answers 200;
`ready`: /v2/health/ready answers 200; `first answer`: the first inference's response, sent as
soon as it is ready) and by the runtime's own /metrics, read after that answer:
`tidal_engine_load_seconds{phase=fetch|deserialize|warmup}` and `tidal_startup_seconds` (which,
its help text notwithstanding, counts from the server object's creation, after the imports, not
from the process's start). `before load` is the wall clock's ready minus the three load phases:
interpreter, imports, config and the listener. Every process runs with OMP_NUM_THREADS=1 and
`onnxruntime.intraOpThreads: 1`.

Prints per size and way the median (range) seconds of each phase, and the median of the
per-round ratios cold/warm (each round's cold and warm start run one after the other, cold first
in odd rounds and warm first in even ones, so the ratio compares starts under about the same
load from whatever else runs on the machine).
Not measured: a cache on a different disk than the store, and a cold page cache (the object and
the cached file are in the kernel's page cache here: no root to drop it).

    .venv/bin/python bench/s3_routable.py [--mib 16,384] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BUCKET = "engines"
MODEL = "mlp"
WAYS = ("cold", "warm")
LOAD_PHASES = ("fetch", "deserialize", "warmup")
# Table rows in order: (row name, key in a Start's seconds).
ROWS = (
    ("fetch (metrics)", "fetch"),
    ("deserialize (metrics)", "deserialize"),
    ("warmup (metrics)", "warmup"),
    ("before load (ready - load)", "before load"),
    ("startup (metrics, see doc)", "startup"),
    ("live (wall)", "live"),
    ("ready (wall)", "ready"),
    ("first answer (wall)", "first answer"),
)


@dataclass(frozen=True)
class Start:
    """One runtime start's seconds by phase (keys of ROWS)."""

    way: str
    seconds: dict[str, float]


def parse_sizes(text: str) -> list[int]:
    """`--mib 16,384` -> [16, 384]; each a positive whole number of MiB."""
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or any(size <= 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"sizes in MiB, comma-separated and positive: {text!r}")
    return sizes


def load_phases(metrics_text: str, model: str = MODEL) -> dict[str, float]:
    """The load phases' seconds (sums of `tidal_engine_load_seconds` for `model`) and
    `startup` (`tidal_startup_seconds`) from a /metrics page."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if (
                sample.name == "tidal_engine_load_seconds_sum"
                and sample.labels.get("model") == model
            ):
                phase = sample.labels["phase"]
                found[phase] = found.get(phase, 0.0) + sample.value
            elif sample.name == "tidal_startup_seconds":
                found["startup"] = sample.value
    return found


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def format_table(title: str, starts: Sequence[Start]) -> list[str]:
    """Per phase: each way's median (range) and the median of the per-round ratios cold/warm
    (the i-th cold start is paired with the i-th warm start)."""
    by_way = {way: [s for s in starts if s.way == way] for way in WAYS}
    lines = [
        title,
        f"  {'phase (s)':28s} {'cold: median (range)':>24s} {'warm: median (range)':>24s} "
        f"{'cold/warm (range)':>20s}",
    ]
    for row, key in ROWS:
        cells = []
        for way in WAYS:
            values = [s.seconds[key] for s in by_way[way] if key in s.seconds]
            cells.append(spread(values) if values else "-")
        pairs = [
            (c.seconds[key], w.seconds[key])
            for c, w in zip(by_way["cold"], by_way["warm"], strict=False)
            if key in c.seconds and key in w.seconds and w.seconds[key] > 0
        ]
        ratios = [c / w for c, w in pairs]
        ratio = (
            f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            if ratios
            else "-"
        )
        lines.append(f"  {row:28s} {cells[0]:>24s} {cells[1]:>24s} {ratio:>20s}")
    return lines


# -- the shell: the store, the models, the runtime processes --------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_status(url: str, body: bytes | None = None, timeout: float = 5.0) -> int:
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"} if body else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return -1


def start_runtime(
    way: str,
    config: dict[str, object],
    env: dict[str, str],
    work: Path,
    infer_body: bytes,
    timeout: float,
) -> Start:
    """Spawn the runtime, time it to live, ready and its first answer, read its /metrics."""
    port = free_port()
    config_path = work / "runtime.json"
    config_path.write_text(json.dumps(config))
    base = f"http://127.0.0.1:{port}"
    seconds: dict[str, float] = {}
    log_path = work / f"runtime-{way}.log"
    with log_path.open("wb") as log:
        started = time.perf_counter()
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "tidal.runtime", "--config", str(config_path)),
                *("--host", "127.0.0.1", "--port", str(port)),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            while "ready" not in seconds:
                if process.poll() is not None or time.perf_counter() - started > timeout:
                    tail = log_path.read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"the runtime did not get ready ({way}):\n{tail}")
                if (
                    "live" not in seconds
                    and http_status(f"{base}/v2/health/live", timeout=1) == 200
                ):
                    seconds["live"] = time.perf_counter() - started
                if http_status(f"{base}/v2/health/ready", timeout=1) == 200:
                    seconds["ready"] = time.perf_counter() - started
                    seconds.setdefault("live", seconds["ready"])
                else:
                    time.sleep(0.02)
            status = http_status(f"{base}/v2/models/{MODEL}/infer", infer_body, timeout=60)
            if status != 200:
                raise RuntimeError(f"the first inference answered {status} ({way})")
            seconds["first answer"] = time.perf_counter() - started
            with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
                phases = load_phases(response.read().decode())
        finally:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    missing = [p for p in LOAD_PHASES if p not in phases]
    if missing:
        raise RuntimeError(f"/metrics lacks the load phases {missing} ({way})")
    seconds.update(phases)
    seconds["before load"] = seconds["ready"] - sum(phases[p] for p in LOAD_PHASES)
    return Start(way, seconds)


def runtime_config(uri: str, sha: str, cache: Path, store: Any) -> dict[str, object]:
    """One model preloaded from the store, the node's engine cache at `cache`, one thread."""
    return {
        "models": [
            {
                "name": MODEL,
                "engines": [{"uri": uri, "sha256": sha}],
                "maxBatchSize": 8,
                "warmup": {"batchSizes": [1], "iterations": 1},
            }
        ],
        "memory": {"engineCacheBudgetBytes": 4 * 2**30},
        "cacheDir": str(cache),
        "s3": {"endpoint": store.endpoint},
        "onnxruntime": {"intraOpThreads": 1},
        "shutdownDrainSeconds": 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=parse_sizes, default=[16, 384], help="e.g. 16,384")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per start")
    args = parser.parse_args(argv)

    import hashlib

    from tidal.runtime.modelgen import mlp_hidden_for_bytes, write_mlp
    from tidal.sandbox.binaries import ensure_binaries
    from tidal.sandbox.objectstore import ObjectStore

    binaries = ensure_binaries()
    work = Path(tempfile.mkdtemp(prefix="tidal-s3-routable-"))
    store = ObjectStore.start(binaries.versitygw, work / "store")
    env = {
        **os.environ,
        **store.env(),
        "OMP_NUM_THREADS": "1",
        "TIDAL_GRPC_PORT": "0",
        "PYTHONUNBUFFERED": "1",
    }
    print(
        f"versitygw on 127.0.0.1; the runtime's engine cache and the store on the same disk "
        f"({work}); {args.rounds} rounds of a cold and a warm start, in turns; "
        f"{os.cpu_count()} cores"
    )
    try:
        store.create_bucket(BUCKET)
        for mib in args.mib:
            inputs, outputs = 16, 4
            hidden = mlp_hidden_for_bytes(mib * 2**20, inputs, outputs)
            info = write_mlp(work / f"mlp-{mib}.onnx", inputs, hidden, outputs, seed=mib)
            key = f"bench/mlp-{mib}mib/model.onnx"
            store.put_file(BUCKET, key, info.path)
            sha = hashlib.sha256(info.path.read_bytes()).hexdigest()
            assert sha == info.sha256
            info.path.unlink()
            body = json.dumps(
                {
                    "inputs": [
                        {
                            "name": info.input_name,
                            "datatype": "FP32",
                            "shape": [1, inputs],
                            "data": [0.5] * inputs,
                        }
                    ]
                }
            ).encode()
            starts: list[Start] = []
            warm_cache = work / f"cache-{mib}-warm"
            for round_ in range(args.rounds):
                # The first round's cold start fills the warm cache; later rounds' cold starts
                # get a new, empty directory each. The order alternates by round so that neither
                # way always follows the other's process teardown.
                caches = {"cold": warm_cache if round_ == 0 else work / f"cache-{mib}-{round_}"}
                caches["warm"] = warm_cache
                order = WAYS if round_ % 2 == 0 else WAYS[::-1]
                for way in order:
                    config = runtime_config(f"s3://{BUCKET}/{key}", sha, caches[way], store)
                    start = start_runtime(way, config, env, work, body, args.timeout)
                    starts.append(start)
                    took = start.seconds
                    print(
                        f"  {mib} MiB round {round_ + 1} {way}: ready {took['ready']:.3f} s, "
                        f"first answer {took['first answer']:.3f} s, fetch {took['fetch']:.3f} s",
                        flush=True,
                    )
                if round_ > 0:
                    shutil.rmtree(caches["cold"])
            shutil.rmtree(warm_cache)
            title = (
                f"engine {info.size_bytes / 2**20:.0f} MiB (MLP {inputs}x{hidden}x{hidden}x"
                f"{outputs}, ONNX), {args.rounds} rounds; load average "
                f"{os.getloadavg()[0]:.2f} at the end"
            )
            print("\n".join(format_table(title, starts)), flush=True)
    finally:
        store.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

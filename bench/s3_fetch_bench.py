"""Fetching an engine from an S3-compatible store: the runtime's path against a raw GET.

Starts the sandbox's object store (versitygw, `make sandbox-binaries`) on 127.0.0.1, puts one
object of `--mib` MiB, and fetches it `--repeat` times each way, the ways one after another in
each repetition, into files on the same disk (the node's engine cache is a directory too):

* `raw GET`: one presigned GET streamed to a file with urllib (what `curl -o` does): the baseline;
* `raw GET + sha256`: the same, hashing as it goes (what any verified download must do);
* `runtime`: `tidal.runtime.storage.EngineStore.fetch` — obstore, ranged reads of `--part-mib` MiB,
  `--concurrency` at once, written in order and hashed on a thread of its own, sha256 verified;
* `runtime, one stream`: the same with the part as large as the object (one GET);
* `minio-py` (when the `minio` package is installed): the MinIO Python client's `fget_object`,
  a candidate client, with the same hashing afterwards left out (it is already slower).

Prints, per way, MB/s (median of the repeats), the ratio to the raw GET of the same repetition
(median of the per-repetition ratios, and their range; the runtime's goal is >= 0.90) and this
process's CPU seconds per fetch (all threads; median): on a shared machine the ratio moves with
what else runs, the CPU seconds much less.

    .venv/bin/python bench/s3_fetch_bench.py [--mib 512] [--repeat 7]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from tidal.runtime.config import S3Spec
from tidal.runtime.storage import EngineStore
from tidal.sandbox.binaries import ensure_binaries
from tidal.sandbox.objectstore import ObjectStore

BUCKET = "engines"
KEY = "bench/model.bin"


def raw_get(url: str, target: Path, digest: bool) -> None:
    h = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=120) as response, target.open("wb") as out:
        while chunk := response.read(1 << 20):
            if digest:
                h.update(chunk)
            out.write(chunk)


def cpu_seconds() -> float:
    """This process's CPU time so far, every thread's (the store is another process)."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--part-mib", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)

    import obstore

    binaries = ensure_binaries()
    work = Path(tempfile.mkdtemp(prefix="tidal-s3-bench-"))
    store = ObjectStore.start(binaries.versitygw, work / "store")
    try:
        store.create_bucket(BUCKET)
        data = os.urandom(args.mib * 2**20)
        sha = hashlib.sha256(data).hexdigest()
        store.put(BUCKET, KEY, data)
        del data
        os.environ.update(store.env())
        url = obstore.sign(store.client(BUCKET), "GET", KEY, timedelta(hours=1))
        size = args.mib * 2**20

        def runtime(part_mib: int, concurrency: int) -> Callable[[Path], None]:
            spec = S3Spec(
                endpoint=store.endpoint, part_bytes=part_mib * 2**20, concurrency=concurrency
            )

            def fetch(target: Path) -> None:
                engine_store = EngineStore(str(target), spec)
                engine_store.fetch(f"s3://{BUCKET}/{KEY}", sha)

            return fetch

        ways: dict[str, Callable[[Path], None]] = {
            "raw GET": lambda t: raw_get(url, t, digest=False),
            "raw GET + sha256": lambda t: raw_get(url, t, digest=True),
            f"runtime ({args.part_mib} MiB parts x {args.concurrency})": runtime(
                args.part_mib, args.concurrency
            ),
            "runtime, one stream": runtime(args.part_mib, 1),
        }
        try:
            from minio import Minio

            client = Minio(
                f"127.0.0.1:{store.port}",
                access_key=store.access_key,
                secret_key=store.secret_key,
                secure=False,
                region="us-east-1",
            )
            ways["minio-py fget_object"] = lambda t: client.fget_object(BUCKET, KEY, str(t))
        except ImportError:
            pass
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeat):
            for name, way in ways.items():
                target = work / "out" / name.replace(" ", "_").replace("/", "_")
                target.parent.mkdir(parents=True, exist_ok=True)
                used = cpu_seconds()
                start = time.perf_counter()
                way(target)
                seconds[name].append(time.perf_counter() - start)
                cpu[name].append(cpu_seconds() - used)
                if target.is_dir():
                    for f in target.iterdir():
                        f.unlink()
                    target.rmdir()
                else:
                    target.unlink()
        base = seconds["raw GET"]
        print(
            f"object {args.mib} MiB from versitygw on 127.0.0.1, {args.repeat} repetitions, "
            f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end"
        )
        print(f"{'way':40s} {'MB/s':>7s} {'vs raw GET (median, range)':>28s} {'CPU s':>7s}")
        for name, values in seconds.items():
            ratios = [b / v for b, v in zip(base, values, strict=True)]
            spread = f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            print(
                f"{name:40s} {size / statistics.median(values) / 1e6:7.0f} {spread:>28s} "
                f"{statistics.median(cpu[name]):7.3f}"
            )
    finally:
        store.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the release script's push costs `make test`: two image archives to the sandbox's registry.

Starts the sandbox's OCI registry (CNCF distribution, `make sandbox-binaries`) on 127.0.0.1 and
makes two OCI archives of one incompressible layer each, the stored sizes of the two images
`make test` pushes (`tidal-operator` 89 MiB, `tidal-runtime-cpu` 151 MiB: bench/RESULTS.md,
"Images"). For each of `--rounds` rounds, on a fresh registry:

* `copy`: the baseline, both archives copied to a new file on the same disk;
* `push`: `tidal.sandbox.release.push_archive` of both (every blob uploaded);
* `again`: the same push again (every blob already there: the manifest only).

Prints the median (range) seconds of each and the median per-round ratio against `copy`.

    .venv/bin/python bench/registry_push.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

from tidal.sandbox.binaries import Binaries
from tidal.sandbox.images import oci_archive
from tidal.sandbox.registry import Registry
from tidal.sandbox.release import Target, push_archive

SIZES_MIB = {"operator": 89, "runtime-cpu": 151}


def make_archive(directory: Path, kind: str, mib: int) -> Path:
    layer = directory / f"{kind}.layer.tar"
    with tarfile.open(layer, "w") as t:
        data = os.urandom(mib * 2**20)
        info = tarfile.TarInfo("blob.bin")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    out = directory / f"{kind}.oci.tar"
    return oci_archive(layer, f"localhost/bench/{kind}:1", out, entrypoint=["/x"], user="1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    timings: dict[str, list[float]] = {"copy": [], "push": [], "again": []}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-push-") as tmp:
        root = Path(tmp)
        archives = {k: make_archive(root, k, mib) for k, mib in SIZES_MIB.items()}
        for r in range(args.rounds):
            t0 = time.monotonic()
            for kind, archive in archives.items():
                shutil.copyfile(archive, root / f"{kind}.copy")
                (root / f"{kind}.copy").unlink()
            timings["copy"].append(time.monotonic() - t0)
            registry = Registry.start(Binaries.locate().registry, root / f"registry-{r}")
            try:
                target = Target(f"{registry.host}/tidal-serving")
                for way in ("push", "again"):
                    t0 = time.monotonic()
                    for kind, archive in archives.items():
                        push_archive(archive, target, kind)
                    timings[way].append(time.monotonic() - t0)
            finally:
                registry.stop()
    total = sum(SIZES_MIB.values())
    print(f"two archives, {total} MiB in all, {args.rounds} rounds (median, range in seconds)")
    for way, values in timings.items():
        ratios = [v / c for v, c in zip(values, timings["copy"], strict=True)]
        print(
            f"  {way:6} {statistics.median(values):6.2f} s ({min(values):.2f}-{max(values):.2f})"
            f"   {statistics.median(ratios):5.2f}x copy"
        )


if __name__ == "__main__":
    main()

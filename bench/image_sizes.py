"""Sizes of the project's images as built here (OCI archives under ``~/.cache/tidal/images``).

    python bench/image_sizes.py [ARCHIVE ...]     # default: the newest archive of each kind

For each image: its layers' bytes as stored (gzip) and unpacked (the tar streams, what the node's
disk holds), the same for the layers above the shared Debian base, and its title/version
labels. Compare two builds by naming their
archives (e.g. one from another checkout's build).
"""

from __future__ import annotations

import gzip
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

CACHE = Path.home() / ".cache" / "tidal" / "images"
KINDS = ("operator", "runtime-cpu", "debian-python")
MIB = 1024 * 1024


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    member = tar.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
    assert member is not None, digest
    return member.read()


def describe(archive: Path) -> dict[str, Any]:
    with tarfile.open(archive) as tar:
        index = json.loads(_blob_or_file(tar, "index.json"))
        manifest = json.loads(_blob(tar, index["manifests"][0]["digest"]))
        config = json.loads(_blob(tar, manifest["config"]["digest"]))
        unpacked = [_unpacked_size(tar, layer) for layer in manifest["layers"]]
    layers = [layer["size"] for layer in manifest["layers"]]
    labels = (config.get("config") or {}).get("Labels") or {}
    return {
        "archive": archive.name,
        "layers": len(layers),
        "total_mib": round(sum(layers) / MIB, 1),
        "above_base_mib": round(sum(layers[1:]) / MIB, 1),
        "unpacked_mib": round(sum(unpacked) / MIB, 1),
        "unpacked_above_base_mib": round(sum(unpacked[1:]) / MIB, 1),
        "title": labels.get("org.opencontainers.image.title"),
        "version": labels.get("org.opencontainers.image.version"),
    }


def _unpacked_size(tar: tarfile.TarFile, layer: dict[str, Any]) -> int:
    member = tar.extractfile("blobs/sha256/" + layer["digest"].split(":", 1)[1])
    assert member is not None, layer
    stream = gzip.GzipFile(fileobj=member) if "gzip" in layer["mediaType"] else member
    total = 0
    while chunk := stream.read(1 << 20):
        total += len(chunk)
    return total


def _blob_or_file(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    assert member is not None, name
    return member.read()


def newest(kind: str) -> Path | None:
    found = sorted(CACHE.glob(f"{kind}-*.oci.tar"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def main(argv: list[str]) -> int:
    archives = [Path(a) for a in argv] or [p for k in KINDS if (p := newest(k)) is not None]
    for archive in archives:
        print(json.dumps(describe(archive)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The image cache's pruning (pure file handling; the builds themselves run in e2e)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tidal.sandbox import images


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(images, "images_dir", lambda: tmp_path)
    return tmp_path


def _archive(cache: Path, name: str, mtime: float) -> Path:
    path = cache / f"{name}.oci.tar"
    path.write_bytes(b"x")
    os.utime(path, (mtime, mtime))
    return path


def test_keeps_the_most_recent_of_each_kind_and_what_is_in_use(cache: Path) -> None:
    operators = [_archive(cache, f"operator-{i:016x}", 1000.0 + i) for i in range(6)]
    runtimes = [_archive(cache, f"runtime-cpu-{i:016x}", 1000.0 + i) for i in range(3)]
    base = _archive(cache, "debian-python-68bb5342e4a20bda", 1.0)
    in_use = operators[0]  # the oldest operator, rebuilt-free reuse of an old commit

    dropped = images.prune_archives(keep={in_use, runtimes[0], base}, per_kind=2)

    left = sorted(p.name for p in cache.glob("*.oci.tar"))
    assert sorted(dropped) == sorted(operators[1:5] + runtimes[1:2]), left
    # the one in use is touched, so it counts as the most recent; two operators in all stay
    assert left == sorted(
        [p.name for p in (operators[0], operators[5])]
        + [p.name for p in runtimes[:1]]
        + [runtimes[2].name, base.name]
    ), left

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


def test_a_build_whose_image_another_checkout_removed_before_its_push_builds_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """buildah's storage is the machine's: another checkout's rmi of the same image between
    this build and its push ("image not known", seen with two worktrees building) is a build
    again, not a failed sandbox; any other push failure is raised as before."""
    calls: list[str] = []
    gone = 'Error: reading config blob sha256:73: locating image with ID "73": image not known'

    def run(argv: list[str], env: object = None, cwd: object = None) -> str:
        calls.append(argv[1])
        if argv[1] == "push":
            if calls.count("push") == 1:
                raise images.ImageBuildError(f"buildah push … exited 125:\n{gone}")
            Path(argv[-1].split(":")[1]).write_bytes(b"archive")
        return ""

    built = _build_operator(cache, monkeypatch, run)

    assert built.archive.read_bytes() == b"archive", (built, calls)
    assert calls.count("bud") == 2 and calls.count("push") == 2, calls

    def refused(argv: list[str], env: object = None, cwd: object = None) -> str:
        if argv[1] == "push":
            raise images.ImageBuildError("buildah push … exited 125:\nno space left on device")
        return ""

    built.archive.unlink()
    with pytest.raises(images.ImageBuildError, match="no space left"):
        _build_operator(cache, monkeypatch, refused)


def test_a_build_whose_cached_layer_another_checkout_removed_builds_again(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race at the build's own cache check ("layer not known": two fresh clones'
    `make test` side by side, 2026-12-07) is a build again too."""
    calls: list[str] = []
    gone = (
        "Error: checking if cached image exists from a previous build: getting top layer "
        "info: layer not known"
    )

    def run(argv: list[str], env: object = None, cwd: object = None) -> str:
        calls.append(argv[1])
        if argv[1] == "bud" and calls.count("bud") == 1:
            raise images.ImageBuildError(f"buildah bud … exited 125:\n{gone}")
        if argv[1] == "push":
            Path(argv[-1].split(":")[1]).write_bytes(b"archive")
        return ""

    built = _build_operator(cache, monkeypatch, run)

    assert built.archive.read_bytes() == b"archive", (built, calls)
    assert calls.count("bud") == 2 and calls.count("push") == 1, calls


def _build_operator(cache: Path, monkeypatch: pytest.MonkeyPatch, run: object) -> images.BuiltImage:
    """The operator image's build with buildah replaced by ``run`` (no storage, no network)."""
    monkeypatch.setattr(images, "_run", run)
    monkeypatch.setattr(images, "_buildah_env", dict)
    monkeypatch.setattr(images, "_image_id", lambda archive, env: "id")
    monkeypatch.setattr(images, "_pip_conf", lambda: cache / "pip.conf")
    base = images.BuiltImage("localhost/tidal/debian-python:bookworm", cache / "base.tar", 0.0)
    dockerfile = images.REPO / "images" / "operator.Dockerfile"
    return images.dockerfile_image(dockerfile, images.OPERATOR_IMAGE, base)


def test_a_context_of_nothing_digests_the_dockerfile_alone() -> None:
    """The model store's build context lets no file in (``*`` alone): its tag changes with its
    Dockerfile only, not with every file git lists."""
    import hashlib

    dockerfile = images.REPO / "images" / "modelstore.Dockerfile"
    expected = hashlib.sha256(dockerfile.read_bytes()).hexdigest()[:16]
    assert images.context_digest(dockerfile) == expected
    assert (
        images.context_digest(images.REPO / "images" / "operator.Dockerfile")
        != (
            hashlib.sha256(
                (images.REPO / "images" / "operator.Dockerfile").read_bytes()
            ).hexdigest()[:16]
        )
    ), "the operator's context (its package) is in its digest"

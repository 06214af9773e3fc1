"""uv.lock pins every dependency, and what installs dependencies uses it: `make venv` (the dev
virtualenv) and the CPU images (images/requirements/<image>.txt, exported from the lock by
`make lock`). Stale files fail here with the command that renews them."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
UV = Path(sys.executable).parent / "uv"  # make venv installs it beside the interpreter
# Image -> the extras its Dockerfile installs (images/<image>.Dockerfile).
IMAGE_EXTRAS = {"operator": ["operator"], "runtime-cpu": ["runtime", "gateway", "builder"]}


def uv(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(UV), *args], cwd=REPO, capture_output=True, text=True, timeout=240, check=False
    )


def test_the_lock_matches_pyproject() -> None:
    result = uv("lock", "--check")
    assert result.returncode == 0, f"uv.lock is stale: run `make lock`\n{result.stderr}"


@pytest.mark.parametrize("image", sorted(IMAGE_EXTRAS))
def test_image_requirements_are_the_lock_exported(image: str, tmp_path: Path) -> None:
    extras = [arg for extra in IMAGE_EXTRAS[image] for arg in ("--extra", extra)]
    committed = REPO / "images" / "requirements" / f"{image}.txt"
    out = tmp_path / "req.txt"
    result = uv("export", "-q", "--frozen", "--no-emit-project", *extras, "-o", str(out))
    assert result.returncode == 0, result.stderr

    def pins(text: str) -> list[str]:  # the header names the output path; the pins must agree
        return [line for line in text.splitlines() if not line.startswith("#")]

    assert pins(committed.read_text()) == pins(out.read_text()), (
        f"{committed.relative_to(REPO)} is not uv.lock's export: run `make lock`"
    )
    assert all(
        re.match(r"^[a-z0-9._-]+==[^ ]+", line) or line.strip().startswith("--hash=")
        for line in pins(committed.read_text())
        if line and not line.startswith(" ")
    ), "every requirement is pinned to one version"


def test_this_virtualenv_holds_the_locked_versions(tmp_path: Path) -> None:
    """`make venv` installs the lock's pins of the dev extra (and reinstalls when uv.lock
    changes); a virtualenv made otherwise fails here, naming what differs."""
    out = tmp_path / "dev.txt"
    result = uv("export", "-q", "--frozen", "--no-emit-project", "--extra", "dev", "-o", str(out))
    assert result.returncode == 0, result.stderr
    pinned = {}
    for line in out.read_text().splitlines():
        if line and not line.startswith(("#", " ")):
            req = Requirement(line.removesuffix("\\").strip())
            if req.marker is None or req.marker.evaluate():  # this interpreter's pin
                pinned[req.name] = str(req.specifier).removeprefix("==")
    assert len(pinned) > 50, f"the dev extra's export pins only {pinned}"
    differ = {}
    for name, version in pinned.items():
        try:
            installed = md.version(name)
        except md.PackageNotFoundError:
            continue  # a platform's or Python version's own requirement (markers)
        if installed != version:
            differ[name] = f"{installed} installed, {version} locked"
    assert not differ, f"run `make venv`: {differ}"

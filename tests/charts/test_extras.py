"""Each deployable's dependency set (pyproject's extras) holds what its program imports and no
more: the operator image carries no inference stack, the runtime image no Kubernetes client.

The closure of an extra is read from the installed distributions' metadata (the dev virtualenv
installs every extra); what a program imports is what a fresh interpreter holds after importing
its modules."""

from __future__ import annotations

import functools
import importlib.metadata as md
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from chart_helpers import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
# The modules each program runs (its entrypoint and everything it loads at start).
PROGRAMS = {
    "operator": [
        "tidal.operator.__main__",
        "tidal.operator.shell.handlers",
        "tidal.operator.shell.signals",
        "tidal.operator.crdgen",
    ],
    "runtime": [
        "tidal.runtime.__main__",
        "tidal.runtime.server",
        "tidal.runtime.grpc_server",
        "tidal.runtime.backends.onnx",
    ],
    "gateway": ["tidal.gateway.__main__", "tidal.gateway.server", "tidal.gateway.grpc_proxy"],
}
NOT_IN_THE_OPERATOR = {"numpy", "pandas", "onnxruntime", "onnx", "grpcio", "protobuf", "matplotlib"}
NOT_IN_THE_RUNTIME = {"kopf", "kubernetes", "pandas", "matplotlib", "onnx"}


def closure(requirements: list[str], extras: set[str] | None = None) -> set[str]:
    """Every distribution the requirements pull in (markers evaluated here), by canonical name."""
    seen: set[str] = set()
    todo = [(Requirement(r), extras or {""}) for r in requirements]
    while todo:
        req, parent_extras = todo.pop()
        if req.marker is not None and not any(
            req.marker.evaluate({"extra": e}) for e in parent_extras
        ):
            continue
        name = canonicalize_name(req.name)
        key = name + "[" + ",".join(sorted(req.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        for sub in md.requires(req.name) or []:
            todo.append((Requirement(sub), set(req.extras) | {""}))
    return {k.split("[", 1)[0] for k in seen}


def extra_closure(*extras: str) -> set[str]:
    reqs = list(PROJECT["dependencies"])
    for extra in extras:
        reqs += PROJECT["optional-dependencies"][extra]
    return closure(reqs)


@functools.cache
def file_owners() -> dict[str, str]:
    """Installed file -> its distribution."""
    owner: dict[str, str] = {}
    for dist in md.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        for file in dist.files or []:
            if file.suffix in (".py", ".so", ".pyc"):
                owner[str(Path(dist.locate_file(file)).resolve())] = name
    return owner


def imported_distributions(modules: list[str]) -> set[str]:
    """Third-party distributions whose files a fresh interpreter has loaded after the imports
    (by the distributions' RECORD, so namespace packages such as ``google`` count right)."""
    script = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted({getattr(m, '__file__', None) or '' for m in "
        "list(sys.modules.values())})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True
    )
    loaded = {str(Path(f).resolve()) for f in json.loads(out.stdout.strip().splitlines()[-1]) if f}
    owner = file_owners()
    # Imported when present, never required (aiohttp's brotli, the runtime's BF16 through
    # ml_dtypes); setuptools' distutils shim, which site loads into every interpreter.
    optional = {"brotli", "ml-dtypes", "setuptools"}
    found = {owner[f] for f in loaded if f in owner}
    return found - optional - {"tidal", "tidal-sandbox"}


def test_the_operator_extra_holds_no_inference_stack() -> None:
    pulled = extra_closure("operator")
    assert not pulled & NOT_IN_THE_OPERATOR, sorted(pulled & NOT_IN_THE_OPERATOR)


def test_the_runtime_image_s_extras_hold_no_kubernetes_client() -> None:
    pulled = extra_closure("runtime", "gateway")
    assert not pulled & NOT_IN_THE_RUNTIME, sorted(pulled & NOT_IN_THE_RUNTIME)


@pytest.mark.parametrize(
    ("program", "extras"),
    [("operator", ["operator"]), ("runtime", ["runtime"]), ("gateway", ["gateway"])],
)
def test_each_program_imports_only_what_its_extra_installs(program: str, extras: list[str]) -> None:
    imported = imported_distributions(PROGRAMS[program])
    missing = imported - extra_closure(*extras)
    assert not missing, f"{program} imports distributions its extra lacks: {sorted(missing)}"


def test_the_builder_runs_on_what_the_cpu_runtime_image_installs() -> None:
    """ModelBuild Jobs run `python -m tidal.runtime.builder` in the CPU runtime image (the
    operator's default build image): the builder's imports are within that image's extras, and
    its Dockerfile installs them."""
    extras = ("runtime", "gateway", "builder")
    imported = imported_distributions(
        [
            "tidal.runtime.builder.__main__",
            "tidal.runtime.builder.build",
            "tidal.runtime.builder.onnxrt",
            "onnxruntime.quantization",
        ]
    )
    missing = imported - extra_closure(*extras)
    assert not missing, f"the builder imports what the CPU runtime image lacks: {sorted(missing)}"
    # The image installs uv.lock's export of those extras (tests/test_lock.py keeps it so).
    dockerfile = (REPO / "images" / "runtime-cpu.Dockerfile").read_text()
    assert "COPY images/requirements/runtime-cpu.txt /tmp/requirements.txt" in dockerfile
    requirements = (REPO / "images" / "requirements" / "runtime-cpu.txt").read_text()
    pinned = {canonicalize_name(n) for n in re.findall(r"^([A-Za-z0-9._-]+)==", requirements, re.M)}
    assert not imported - pinned, f"the image's requirements lack {sorted(imported - pinned)}"


def test_the_tensorrt_builder_runs_on_what_the_gpu_runtime_image_installs() -> None:
    """TensorRT ModelBuild Jobs run the builder in the runtime image on NVIDIA's TensorRT image
    (TensorRT and CUDA come from that base): the rest of its imports are within the extras its
    Dockerfile installs, and the image's build checks that TensorRT's builder imports."""
    imported = imported_distributions(
        ["tidal.runtime.builder.__main__", "tidal.runtime.builder.tensorrt"]
    )
    missing = imported - extra_closure("runtime", "gateway", "builder")
    assert not missing, f"the builder imports what the GPU runtime image lacks: {sorted(missing)}"
    dockerfile = (REPO / "images" / "runtime.Dockerfile").read_text()
    assert "[runtime,gateway,builder]" in dockerfile
    assert "t.import_builder()" in dockerfile


def test_modelgen_has_an_extra_with_onnx() -> None:
    assert "onnx" in extra_closure("modelgen")
    imported = imported_distributions(["tidal.runtime.modelgen"])
    assert not imported - extra_closure("modelgen"), sorted(imported - extra_closure("modelgen"))

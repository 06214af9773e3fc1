"""How a scenario's manifest reaches the real node: engine files served from the host, the
runtime image built here (``Sandbox.adapt``, ``Sandbox.engine_uri``, ``files.FileServer``)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tidal.sandbox import Sandbox, SandboxConfig
from tidal.sandbox.files import FileServer

BUILT = "localhost/tidal/runtime-cpu:0123abcd"


@pytest.fixture
def files() -> Iterator[FileServer]:
    server = FileServer("127.0.0.1")
    yield server
    server.close()


def real_node_sandbox(files: FileServer, tmp_path: Path) -> Sandbox:
    """A Sandbox as it is once its real node runs (nothing started: adapt reads only these)."""
    sb = Sandbox(SandboxConfig(real_node=True, state_dir=tmp_path / "state"))
    sb.node = object()
    sb.images = SimpleNamespace(runtime_cpu=SimpleNamespace(name=BUILT))
    sb.files = files
    return sb


def isvc(uri: str, image: str | None = None, baseline: bool = True) -> dict:
    runtime = {"backend": "onnxruntime"} | ({"image": image} if image else {})
    spec: dict = {"runtime": runtime, "models": [{"name": "m", "engines": [{"uri": uri}]}]}
    if baseline:
        spec["rollout"] = {
            "baseline": {
                "runtime": {"backend": "onnxruntime"},
                "models": [{"name": "m", "engines": [{"uri": uri}]}],
            }
        }
    return {"apiVersion": "serving.tidal.dev/v1alpha1", "kind": "InferenceService", "spec": spec}


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        return bytes(r.read())


def test_served_file_is_read_at_every_request(files: FileServer, tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"first")
    url = files.url(path)
    assert url.endswith("/m.onnx") and url.startswith("http://127.0.0.1:"), url
    assert get(url) == b"first"
    path.write_bytes(b"corrupted later")  # the fault scenarios corrupt a file after applying
    assert get(url) == b"corrupted later"
    assert files.url(path) == url  # registering twice: the same URL


def test_only_registered_files_are_served(files: FileServer, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("no")
    files.url(tmp_path / "m.onnx")
    base = files.url(tmp_path / "m.onnx").rsplit("/", 2)[0]
    for route in ("/etc/passwd", f"/{'0' * 16}/secret", "/../secret"):
        with pytest.raises(urllib.error.HTTPError) as info:
            get(base + route)
        assert info.value.code == 404, route


def test_adapt_serves_file_uris_and_sets_the_built_image(files: FileServer, tmp_path: Path) -> None:
    path = tmp_path / "dir with space" / "m.onnx"
    path.parent.mkdir()
    path.write_bytes(b"model")
    manifest = isvc(path.as_uri())
    doc = real_node_sandbox(files, tmp_path).adapt(manifest)
    spec = doc["spec"]
    served = spec["models"][0]["engines"][0]["uri"]
    assert served == files.url(path), served
    assert get(served) == b"model"
    assert spec["rollout"]["baseline"]["models"][0]["engines"][0]["uri"] == served
    assert spec["runtime"]["image"] == BUILT
    assert spec["rollout"]["baseline"]["runtime"]["image"] == BUILT
    assert manifest["spec"]["models"][0]["engines"][0]["uri"] == path.as_uri(), "copy, not edit"


def test_adapt_keeps_a_chosen_image_and_replaces_the_published_one(
    files: FileServer, tmp_path: Path
) -> None:
    sb = real_node_sandbox(files, tmp_path)
    chosen = sb.adapt(isvc("http://models/m.onnx", image="example.org/mine:1", baseline=False))
    assert chosen["spec"]["runtime"]["image"] == "example.org/mine:1"
    assert chosen["spec"]["models"][0]["engines"][0]["uri"] == "http://models/m.onnx"
    published = sb.adapt(isvc("http://m", image="ghcr.io/tidal-serving/runtime:0.1.0"))
    assert published["spec"]["runtime"]["image"] == BUILT


def test_under_the_node_agent_adapt_changes_nothing(files: FileServer, tmp_path: Path) -> None:
    sb = Sandbox(SandboxConfig(state_dir=tmp_path / "state"))
    manifest = isvc((tmp_path / "m.onnx").as_uri())
    assert sb.adapt(manifest) == manifest
    assert sb.engine_uri(tmp_path / "m.onnx") == (tmp_path / "m.onnx").as_uri()
    other = {"kind": "ConfigMap", "data": {"uri": "file:///x"}}
    assert real_node_sandbox(files, tmp_path).adapt(other) is other

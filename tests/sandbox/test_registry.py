"""The sandbox's OCI registry (CNCF distribution, built by `make sandbox-binaries`), the release
script's pushes to it, and the real node's containerd hosts.toml that pulls from it."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tidal.common import release
from tidal.sandbox.__main__ import main as sandbox_main
from tidal.sandbox.binaries import Binaries
from tidal.sandbox.images import oci_archive
from tidal.sandbox.realnode import RealNode, hosts_toml, stale_image_refs, write_hosts
from tidal.sandbox.registry import Registry
from tidal.sandbox.release import (
    REPO,
    ReleaseError,
    Target,
    archive_parts,
    helm_binary,
    push_archive,
    push_chart,
)

MANIFEST_MEDIA = "application/vnd.oci.image.manifest.v1+json"


# -- pure parts ---------------------------------------------------------------------------------
def test_target_names_the_release_images_and_chart_under_the_registry() -> None:
    t = Target("127.0.0.1:5000/tidal-serving")
    assert t.image("operator") == f"127.0.0.1:5000/tidal-serving/tidal-operator:{release.VERSION}"
    assert t.repository("runtime-cpu") == "tidal-serving/tidal-runtime-cpu"
    assert t.chart == "oci://127.0.0.1:5000/tidal-serving/charts/tidal"
    assert t.http and t.base_url == "http://127.0.0.1:5000", t
    # The sandbox's path is the release registry's: the node's mirror maps one onto the other.
    assert t.path == release.REGISTRY.split("/", 1)[1]


def test_target_uses_https_off_loopback_unless_told() -> None:
    assert not Target("ghcr.io/you").http
    assert Target("ghcr.io/you").base_url == "https://ghcr.io"
    assert Target("registry.lan:5000/x", plain_http=True).http
    assert Target("localhost:5000").http and Target("localhost:5000").path == ""


@pytest.mark.parametrize("bad", ["https://ghcr.io/you", "ghcr.io/you:0.1.0", "ghcr.io/You", ""])
def test_a_bad_registry_is_refused_naming_the_argument(bad: str) -> None:
    with pytest.raises(ValueError, match="--registry") as err:
        Target(bad)
    assert "HOST[:PORT][/PATH]" in str(err.value), err.value


def test_hosts_toml_sends_one_host_to_the_mirror_over_http(tmp_path: Path) -> None:
    certs = tmp_path / "certs.d"
    (certs / "stale.example").mkdir(parents=True)
    write_hosts(certs, {"ghcr.io": "http://127.0.0.1:5000"})
    assert sorted(p.name for p in certs.iterdir()) == ["ghcr.io"], list(certs.iterdir())
    text = (certs / "ghcr.io" / "hosts.toml").read_text()
    assert text == hosts_toml("http://127.0.0.1:5000"), text
    assert 'server = "http://127.0.0.1:5000"' in text and '"pull", "resolve"' in text, text
    write_hosts(certs, {})
    assert list(certs.iterdir()) == [], "a node without mirrors keeps no hosts.toml"


# -- the real registry --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = Registry.start(Binaries.locate().registry, tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


def _archive(tmp_path: Path, content: bytes, name: str) -> Path:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        info = tarfile.TarInfo("hello.txt")
        info.size = len(content)
        t.addfile(info, io.BytesIO(content))
    layer_tar = tmp_path / f"{name}.layer.tar"
    layer_tar.write_bytes(layer.getvalue())
    out = tmp_path / f"{name}.oci.tar"
    return oci_archive(layer_tar, f"localhost/x/{name}:1", out, entrypoint=["/x"], user="1")


def _get(url: str, accept: str = MANIFEST_MEDIA) -> tuple[bytes, dict[str, str]]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    with urllib.request.urlopen(req, timeout=30) as answer:
        return answer.read(), dict(answer.headers)


def test_registry_answers_on_loopback_only(registry: Registry) -> None:
    assert registry.host.startswith("127.0.0.1:"), registry.host
    _, headers = _get(registry.url + "/v2/")
    assert headers.get("Docker-Distribution-Api-Version") == "registry/2.0", headers
    assert registry.tags("nothing/here") == [], registry.process.tail()


def test_push_archive_puts_the_archive_s_manifest_byte_for_byte_and_again_the_same(
    registry: Registry, tmp_path: Path
) -> None:
    archive = _archive(tmp_path, b"tidal\n", "one")
    entry, manifest_body, media = archive_parts(archive)
    target = Target(f"{registry.host}/tidal-serving")
    first = push_archive(archive, target, "operator")
    second = push_archive(archive, target, "operator")  # unchanged: same digest, blobs reused
    assert first == second == entry["digest"], (first, second, entry)
    repo = target.repository("operator")
    assert registry.tags(repo) == [release.VERSION], registry.process.tail()
    got, headers = _get(f"{registry.url}/v2/{repo}/manifests/{release.VERSION}", media)
    assert got == manifest_body, (got[:300], manifest_body[:300])
    assert headers.get("Docker-Content-Digest") == first, headers
    for blob in json.loads(got)["layers"]:
        data, _ = _get(f"{registry.url}/v2/{repo}/blobs/{blob['digest']}", "*/*")
        assert "sha256:" + hashlib.sha256(data).hexdigest() == blob["digest"], blob


def test_a_changed_image_pushes_a_new_digest_under_the_same_tag(
    registry: Registry, tmp_path: Path
) -> None:
    target = Target(f"{registry.host}/changed")
    old = push_archive(_archive(tmp_path, b"v1\n", "v1"), target, "runtime-cpu")
    new = push_archive(_archive(tmp_path, b"v2\n", "v2"), target, "runtime-cpu")
    assert old != new, (old, new)
    _, headers = _get(f"{registry.url}/v2/{target.repository('runtime-cpu')}/manifests/0.1.0")
    assert headers.get("Docker-Content-Digest") == new, headers


def test_a_push_the_registry_refuses_says_which_reference_and_why(
    registry: Registry, tmp_path: Path
) -> None:
    # "+" is not in a tag (distribution's reference grammar): the registry's 4xx comes back named.
    target = Target(f"{registry.host}/refused", version="0.1.0+local")
    with pytest.raises(
        ReleaseError, match=r"PUT .*refused/tidal-operator/manifests/0\.1\.0\+local: 4\d\d"
    ):
        push_archive(_archive(tmp_path, b"x\n", "bad"), target, "operator")
    assert registry.tags(target.repository("operator")) == [], registry.process.tail()


def test_the_chart_is_pushed_as_an_oci_artifact_helm_installs_from(registry: Registry) -> None:
    target = Target(f"{registry.host}/tidal-serving")
    helm = helm_binary()
    manifests = []
    for _ in range(2):
        digest = push_chart(target, helm)
        assert digest.startswith("sha256:"), digest
        body, _ = _get(f"{registry.url}/v2/tidal-serving/charts/tidal/manifests/{digest}")
        manifests.append(json.loads(body))
    # helm package of an unchanged checkout gives the same bytes (the tar's times are the files'):
    # the same chart content again. The manifest's digest may differ: helm push stamps it with
    # org.opencontainers.image.created, the time of the push (no flag sets it).
    layers = [[layer["digest"] for layer in m["layers"]] for m in manifests]
    assert layers[0] == layers[1] and len(layers[0]) == 1, manifests
    assert "org.opencontainers.image.created" in manifests[0].get("annotations", {}), manifests[0]
    shown = subprocess.run(
        [helm, "show", "chart", target.chart, "--version", release.VERSION, "--plain-http"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    chart_yaml = yaml.safe_load((REPO / "charts/tidal/Chart.yaml").read_text())
    assert yaml.safe_load(shown.stdout) == chart_yaml, shown.stdout
    assert registry.tags("tidal-serving/charts/tidal") == [release.VERSION], registry.tags(
        "tidal-serving/charts/tidal"
    )


def test_containerd_gets_a_hosts_directory_only_when_a_host_is_mirrored(tmp_path: Path) -> None:
    node = RealNode(api_url="https://10.245.0.1:6443", pki=None, log_dir=tmp_path)  # type: ignore[arg-type]
    assert node._registry_config() == "", "no mirror: containerd's configuration as before"
    node.mirrors = {"ghcr.io": "http://127.0.0.1:5000"}
    section = node._registry_config()
    parsed = tomllib.loads("[plugins]\n  [plugins.'io.containerd.cri.v1.images']\n" + section)
    images = parsed["plugins"]["io.containerd.cri.v1.images"]
    assert images["registry"] == {"config_path": str(node.etc / "certs.d")}, section


def test_the_release_command_refuses_a_bad_registry_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        sandbox_main(["release", "--registry", "https://ghcr.io/you"])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert "argument --registry" in err and "HOST[:PORT][/PATH]" in err, err


def test_the_real_node_pulls_from_the_registry_unless_turned_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On by default, off with TIDAL_SANDBOX_REGISTRY=0 (e2e/README.md)."""
    from tidal.sandbox.cluster import SandboxConfig

    seen = {}
    for value in (None, "1", "0"):
        if value is None:
            monkeypatch.delenv("TIDAL_SANDBOX_REGISTRY", raising=False)
        else:
            monkeypatch.setenv("TIDAL_SANDBOX_REGISTRY", value)
        seen[value] = SandboxConfig(real_node=True).registry
    assert seen == {None: True, "1": True, "0": False}, seen


def test_a_previous_run_s_release_names_are_stale_though_they_share_a_kept_digest() -> None:
    """The release names a run pulled (or tagged) hold the digest of an archive the next run
    imports again: they go, so the next run's node holds no release image before its pull (seen:
    the second run of e2e/test_readme_install.py on one node failed on that); the kept images'
    own by-id and repo-digest references stay."""
    operator, runtime = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    keep = ["localhost/tidal/operator:3bc877e5bd646bd7", "localhost/tidal/runtime-cpu:ab6ad357"]
    refs = {
        keep[0]: operator,
        keep[1]: runtime,
        "sha256:" + "c" * 64: operator,  # the CRI's by-id reference
        "localhost/tidal/operator@" + operator: operator,  # repo digest
        release.image("operator"): operator,  # pulled by the previous run
        "ghcr.io/tidal-serving/tidal-operator@" + operator: operator,
        release.image("runtime-cpu"): runtime,
        "localhost/tidal/operator:0000000000000000": "sha256:" + "d" * 64,  # an older build
    }
    stale = stale_image_refs(refs, keep)
    assert sorted(stale) == sorted(
        [
            release.image("operator"),
            "ghcr.io/tidal-serving/tidal-operator@" + operator,
            release.image("runtime-cpu"),
            "localhost/tidal/operator:0000000000000000",
        ]
    ), stale

"""The release script: build the images, push them and the chart to a registry.

One script for the sandbox and for a real release: ``tidal-sandbox release --registry HOST/PATH``
(``make release REGISTRY=HOST/PATH``)

1. builds (or reuses) the operator, CPU runtime and model store images from
   ``images/*.Dockerfile`` with buildah, as ``make images`` does (:mod:`tidal.sandbox.images`);
2. pushes each image's OCI archive, byte for byte, to ``HOST/PATH/<name>:<version>`` (names and
   version: :mod:`tidal.common.release`) over the OCI distribution API — the digests pushed are
   the archive's, so an unchanged source pushes the same digests again;
3. packages the chart (``helm package``) and pushes it as an OCI artifact
   (``helm push … oci://HOST/PATH/charts``): ``helm install tidal oci://HOST/PATH/charts/tidal``.

Same digests on unchanged sources: the images' are their archives', which are reused while the
Dockerfile and its context are unchanged (``tidal.sandbox.images.context_digest``); an image
rebuilt from an empty cache gets other digests (buildah's timestamps, and pip resolving the
newest versions: no lock file yet). The chart's content (its layer) is the same for unchanged
files and file times; its manifest is not, as ``helm push`` stamps it with the push's time
(``org.opencontainers.image.created``).

Plain HTTP for a registry on 127.0.0.1 or localhost (the sandbox's), HTTPS elsewhere. A registry
that wants credentials gets them from ``TIDAL_REGISTRY_USER`` / ``TIDAL_REGISTRY_PASSWORD``
(basic, or a bearer token fetched with them, as ghcr.io asks); helm uses its own login
(``helm registry login``). Only the sandbox's registry has been pushed to here.

The TensorRT image (``images/runtime.Dockerfile``) stands on NVIDIA's base, which this machine
cannot pull: it is not built or pushed by this script (the workflow builds it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tidal.common import release

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tidal"
# The images this script builds and pushes (kind -> images/<kind>.Dockerfile).
PUSHED_KINDS = ("operator", "runtime-cpu", "modelstore")
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


class ReleaseError(RuntimeError):
    """A push failed; the message names the reference and the registry's answer."""


# -- pure: what goes where -------------------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    """Where a release goes: ``registry`` is ``HOST[:PORT][/PATH]``."""

    registry: str
    version: str = release.VERSION
    plain_http: bool | None = None  # None: plain HTTP for loopback hosts only

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+(/[a-z0-9._\-]+)*", self.registry):
            raise ValueError(
                f"--registry {self.registry!r}: expected HOST[:PORT][/PATH], e.g. "
                "ghcr.io/you or 127.0.0.1:5000/tidal-serving (no scheme, no tag)"
            )

    @property
    def host(self) -> str:
        return self.registry.split("/", 1)[0]

    @property
    def path(self) -> str:
        return self.registry.split("/", 1)[1] if "/" in self.registry else ""

    @property
    def http(self) -> bool:
        if self.plain_http is not None:
            return self.plain_http
        return self.host.rsplit(":", 1)[0] in LOOPBACK or self.host.startswith("[::1]")

    def image(self, kind: str) -> str:
        """The pushed reference: the release image's name and version under ``registry``."""
        return release.image(kind, self.version, self.registry)

    def repository(self, kind: str) -> str:
        """The repository within the host, e.g. ``you/tidal-operator``."""
        return self.image(kind).split("/", 1)[1].rsplit(":", 1)[0]

    @property
    def chart(self) -> str:
        """Where ``helm install`` finds the chart: ``oci://HOST/PATH/charts/tidal``."""
        return f"oci://{self.registry}/charts/tidal"

    @property
    def base_url(self) -> str:
        return f"{'http' if self.http else 'https'}://{self.host}"


def archive_parts(archive: Path) -> tuple[dict[str, Any], bytes, str]:
    """The index entry, bytes and media type of the one manifest an OCI archive holds."""
    with tarfile.open(archive) as tar:
        index = json.load(_member(tar, "index.json"))
        (entry,) = index["manifests"]
        body = _member(tar, _blob_path(entry["digest"])).read()
    media = entry.get("mediaType") or json.loads(body).get("mediaType")
    return entry, body, str(media)


def _blob_path(digest: str) -> str:
    algo, hexdigest = digest.split(":", 1)
    return f"blobs/{algo}/{hexdigest}"


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    got = tar.extractfile(name)
    if got is None:
        raise ReleaseError(f"no {name} in the OCI archive")
    return got


# -- the registry API (shell) ----------------------------------------------------------------------
class RegistryClient:
    """The few calls of the OCI distribution API a push needs, with basic or bearer auth."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.user = os.environ.get("TIDAL_REGISTRY_USER", "")
        self.password = os.environ.get("TIDAL_REGISTRY_PASSWORD", "")
        self._auth: dict[str, str] = {}  # repository -> Authorization header

    def _call(
        self,
        method: str,
        url: str,
        repository: str,
        body: bytes | IO[bytes] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        if not url.startswith("http"):
            url = self.target.base_url + url
        for attempt in (0, 1):
            h = dict(headers or {})
            if repository in self._auth:
                h["Authorization"] = self._auth[repository]
            req = urllib.request.Request(url, data=body, method=method, headers=h)
            try:
                return urllib.request.urlopen(req, timeout=600)
            except urllib.error.HTTPError as exc:
                if exc.code == 401 and attempt == 0 and self._login(exc, repository):
                    if hasattr(body, "seek"):
                        body.seek(0)  # type: ignore[union-attr]
                    continue
                if method == "HEAD" and exc.code == 404:
                    return None
                detail = exc.read()[:500].decode(errors="replace")
                raise ReleaseError(f"{method} {url}: {exc.code} {exc.reason}: {detail}") from None
        raise AssertionError("unreachable")

    def _login(self, exc: urllib.error.HTTPError, repository: str) -> bool:
        challenge = exc.headers.get("WWW-Authenticate", "")
        basic = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        if challenge.lower().startswith("basic"):
            if not self.user:
                return False
            self._auth[repository] = f"Basic {basic}"
            return True
        if not challenge.lower().startswith("bearer"):
            return False
        params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
        query = urllib.parse.urlencode(
            {"service": params.get("service", ""), "scope": f"repository:{repository}:pull,push"}
        )
        req = urllib.request.Request(f"{params['realm']}?{query}")
        if self.user:
            req.add_header("Authorization", f"Basic {basic}")
        with urllib.request.urlopen(req, timeout=60) as answer:
            token = json.load(answer)
        self._auth[repository] = f"Bearer {token.get('token') or token.get('access_token')}"
        return True

    def has_blob(self, repository: str, digest: str) -> bool:
        answer = self._call("HEAD", f"/v2/{repository}/blobs/{digest}", repository)
        return answer is not None

    def put_blob(self, repository: str, digest: str, size: int, data: IO[bytes]) -> None:
        started = self._call("POST", f"/v2/{repository}/blobs/uploads/", repository, body=b"")
        location = urllib.parse.urljoin(self.target.base_url, started.headers["Location"])
        sep = "&" if "?" in location else "?"
        self._call(
            "PUT",
            f"{location}{sep}digest={urllib.parse.quote(digest)}",
            repository,
            body=data,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )

    def put_manifest(self, repository: str, tag: str, body: bytes, media: str) -> str:
        answer = self._call(
            "PUT",
            f"/v2/{repository}/manifests/{tag}",
            repository,
            body=body,
            headers={"Content-Type": media},
        )
        return str(answer.headers.get("Docker-Content-Digest", ""))


def push_archive(archive: Path, target: Target, kind: str) -> str:
    """Push an OCI archive's image, byte for byte, as ``target.image(kind)``; its manifest
    digest (``sha256:…``)."""
    client = RegistryClient(target)
    repository = target.repository(kind)
    entry, manifest_body, media = archive_parts(archive)
    manifest = json.loads(manifest_body)
    with tarfile.open(archive) as tar:
        for blob in [manifest["config"], *manifest["layers"]]:
            if client.has_blob(repository, blob["digest"]):
                continue
            client.put_blob(
                repository, blob["digest"], blob["size"], _member(tar, _blob_path(blob["digest"]))
            )
    pushed = client.put_manifest(repository, target.version, manifest_body, media)
    expected = "sha256:" + hashlib.sha256(manifest_body).hexdigest()
    if pushed and pushed != expected:
        raise ReleaseError(f"{target.image(kind)}: registry says {pushed}, pushed {expected}")
    assert entry["digest"] == expected, (entry, expected)
    return expected


def helm_binary() -> str:
    out = subprocess.run(
        ["bash", str(REPO / "e2e/helm/build-helm.sh")], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def push_chart(target: Target, helm: str | None = None) -> str:
    """``helm package`` the chart and ``helm push`` it to ``oci://REGISTRY/charts``; the chart
    artifact's digest as helm prints it."""
    helm = helm or helm_binary()
    with tempfile.TemporaryDirectory(prefix="tidal-chart-") as tmp:
        subprocess.run(
            [helm, "package", str(CHART), "--destination", tmp],
            check=True,
            capture_output=True,
            text=True,
        )
        (package,) = Path(tmp).glob("tidal-*.tgz")
        argv = [helm, "push", str(package), f"oci://{target.registry}/charts"]
        if target.http:
            argv.append("--plain-http")
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"helm push to {target.chart}: {done.stderr.strip()}")
    found = re.search(r"Digest:\s*(sha256:[0-9a-f]{64})", done.stdout + done.stderr)
    return found.group(1) if found else ""


def run_release(target: Target, *, chart: bool = True) -> dict[str, str]:
    """Build (or reuse) and push the images, then the chart; reference -> digest."""
    from .images import base_image, project_image

    base = base_image()
    pushed = {}
    for kind in PUSHED_KINDS:
        built = project_image(kind, base)
        pushed[target.image(kind)] = push_archive(built.archive, target, kind)
    if chart:
        pushed[f"{target.chart}:{target.version}"] = push_chart(target)
    return pushed

"""Container images for the real node, built here the way a release builds them — no registry.

* ``debian-python``: a Debian minbase root filesystem with Python, made by ``mmdebstrap`` from
  the Debian mirror this machine's apt uses; it stands in for ``python:3.12-slim-bookworm``,
  which cannot be pulled here, and is passed to the Dockerfiles as ``PYTHON_IMAGE``.
* ``pause`` and ``coredns``: one static binary each, wrapped into an OCI image layout.
* the project's images, from its own Dockerfiles (``images/*.Dockerfile``) with Debian's
  ``buildah``, on that base; ``pip`` inside the build reaches PyPI with this machine's CA bundle.
* ``go``: this machine's Go toolchain (``go env GOROOT``) in one layer, standing in for the
  official ``golang`` image as the model store's build stage (``GO_IMAGE``); the build reaches
  the Go module proxy and uses this machine's module and build caches (mounted).

Every image ends as an ``oci-archive`` tarball in the cache (``~/.cache/tidal/images``), named by
a digest of its inputs (the Dockerfile and the files of its build context), so an unchanged
image is not built again, and a changed one always is. The real node imports the tarballs into
containerd (:meth:`tidal.sandbox.realnode.RealNode.import_image`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from .binaries import cache_root

REPO = Path(__file__).resolve().parents[2]
log = logging.getLogger("tidal.sandbox.images")
BASE_IMAGE = "localhost/tidal/debian-python:bookworm"
OPERATOR_IMAGE = "localhost/tidal/operator"
RUNTIME_CPU_IMAGE = "localhost/tidal/runtime-cpu"
MODELSTORE_IMAGE = "localhost/tidal/modelstore"
GO_IMAGE = "localhost/tidal/go"
# Archives kept in the cache of each kind (operator, runtime-cpu, ...): a few recent builds, so
# that switching between branches does not rebuild.
KEPT_PER_KIND = 4
# Bump to rebuild the base when its recipe changes.
BASE_RECIPE = "bookworm minbase python3 python3-venv python-is-python3 ca-certificates v2"


# Builds of one image tried when another checkout's build removes it before its push.
BUILD_TRIES = 3


class ImageBuildError(RuntimeError):
    """An image could not be built; the message has the builder's output."""


@dataclass(frozen=True)
class BuiltImage:
    name: str  # full reference, e.g. localhost/tidal/operator:3f2a…
    archive: Path  # oci-archive tarball
    seconds: float  # build time (0 when reused)


def images_dir() -> Path:
    d = cache_root() / "images"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _buildah_env() -> dict[str, str]:
    """buildah with storage and configuration of its own, under the cache."""
    root = cache_root() / "buildah"
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    storage = root / "storage.conf"
    storage.write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{root / "storage"}"\n'
        f'runroot = "{root / "run"}"\n'
    )
    registries = root / "registries.conf"
    # No registry is reachable: never expand short names, never search.
    registries.write_text('unqualified-search-registries = []\nshort-name-mode = "disabled"\n')
    policy = root / "policy.json"
    policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    containers = root / "containers.conf"
    containers.write_text(
        '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
        f'events_logfile_path = "{root / "events.log"}"\n'
    )
    return {
        **os.environ,
        "CONTAINERS_STORAGE_CONF": str(storage),
        "CONTAINERS_REGISTRIES_CONF": str(registries),
        "CONTAINERS_CONF": str(containers),
        "TMPDIR": str(root / "tmp"),
        "BUILDAH_ISOLATION": "chroot",
    }


def removed_under_us(output: str) -> bool:
    """Whether a failed ``buildah bud`` or ``push`` says a local image or layer is gone (removed
    by another checkout's build sharing the machine's storage), not that the build failed:
    ``image not known`` at the push, ``layer not known`` at the build's cache check (two
    fresh clones' ``make test`` side by side, 2026-12-07)."""
    return "image not known" in output or "layer not known" in output


def _policy_flag() -> str:
    return f"--signature-policy={cache_root() / 'buildah' / 'policy.json'}"


def _run(argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if done.returncode != 0:
        out = (done.stdout + done.stderr)[-4000:]
        raise ImageBuildError(f"{' '.join(argv[:3])} … exited {done.returncode}:\n{out}")
    return done.stdout


def oci_archive(
    layer_tar: Path,
    name: str,
    out: Path,
    *,
    entrypoint: list[str],
    user: str,
    env: list[str] | None = None,
) -> Path:
    """Wrap one uncompressed layer into an OCI image layout tarball (what ``ctr images import``
    and ``buildah pull oci-archive:`` read)."""
    layer = layer_tar.read_bytes()
    layer_hex = hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Entrypoint": entrypoint,
            "User": user,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_hex}"]},
        # One history entry per layer: buildah's layer cache checks that they agree.
        "history": [{"created_by": f"tidal.sandbox.images: {name}"}],
    }
    config_b = json.dumps(config, separators=(",", ":")).encode()
    config_hex = hashlib.sha256(config_b).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": f"sha256:{config_hex}",
            "size": len(config_b),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": f"sha256:{layer_hex}",
                "size": len(layer),
            }
        ],
    }
    manifest_b = json.dumps(manifest, separators=(",", ":")).encode()
    manifest_hex = hashlib.sha256(manifest_b).hexdigest()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": f"sha256:{manifest_hex}",
                "size": len(manifest_b),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                },
            }
        ],
    }
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as t:
        for path, data in (
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
            ("index.json", json.dumps(index).encode()),
            (f"blobs/sha256/{config_hex}", config_b),
            (f"blobs/sha256/{manifest_hex}", manifest_b),
            (f"blobs/sha256/{layer_hex}", layer),
        ):
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return out


def binary_image(binary: Path, name: str, *, user: str = "65532:65532") -> BuiltImage:
    """An image holding one static binary at ``/<name of the binary>``."""
    digest = hashlib.sha256(binary.read_bytes() + name.encode()).hexdigest()[:16]
    out = images_dir() / f"{binary.name}-{digest}.oci.tar"
    if out.exists():
        return BuiltImage(name, out, 0.0)
    t0 = time.monotonic()
    layer = out.with_suffix(".layer")
    with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as t:
        info = t.gettarinfo(str(binary), arcname=binary.name)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mode = 0o755
        with binary.open("rb") as f:
            t.addfile(info, f)
    try:
        oci_archive(layer, name, out, entrypoint=[f"/{binary.name}"], user=user)
    finally:
        layer.unlink(missing_ok=True)
    return BuiltImage(name, out, time.monotonic() - t0)


def base_image() -> BuiltImage:
    """Debian bookworm minbase with Python 3, from the mirror apt already uses (mmdebstrap)."""
    digest = hashlib.sha256(BASE_RECIPE.encode()).hexdigest()[:16]
    out = images_dir() / f"debian-python-{digest}.oci.tar"
    if out.exists():
        return BuiltImage(BASE_IMAGE, out, 0.0)
    t0 = time.monotonic()
    rootfs = out.with_suffix(".rootfs.tar")
    mirror = _apt_mirror()
    env = {**os.environ, "TMPDIR": str(images_dir())}
    _run(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--mode=root",
            "--include=python3,python3-venv,python-is-python3,ca-certificates",
            '--aptopt=Acquire::Check-Valid-Until "false"',
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            '--customize-hook=rm -f "$1"/etc/apt/apt.conf.d/99mmdebstrap',
            "bookworm",
            str(rootfs),
            f"deb {mirror} bookworm main",
        ],
        env=env,
    )
    try:
        oci_archive(rootfs, BASE_IMAGE, out, entrypoint=[], user="")
    finally:
        rootfs.unlink(missing_ok=True)
    return BuiltImage(BASE_IMAGE, out, time.monotonic() - t0)


def _apt_mirror() -> str:
    """The Debian mirror this machine's apt uses (nothing else is contacted)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    for line in Path("/etc/apt/sources.list").read_text().splitlines():
        parts = line.split()
        if parts[:1] == ["deb"]:
            return parts[1] if not parts[1].startswith("[") else parts[2]
    raise ImageBuildError("no Debian mirror found in apt's sources")


def context_digest(dockerfile: Path) -> str:
    """A digest of the Dockerfile and every file its build context lets in (``git ls-files``
    filtered by the ``.dockerignore`` beside it: ``*`` then ``!path`` lines)."""
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    allowed = [line[1:] for line in ignore.read_text().splitlines() if line.startswith("!")]
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "--", *allowed],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    ).stdout.split()
    if not allowed:  # a context of nothing (``*`` alone); git would list every file
        files = []
    h = hashlib.sha256(dockerfile.read_bytes())
    for rel in sorted(files):
        path = REPO / rel
        if path.is_file() and "__pycache__" not in rel:
            h.update(rel.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _pip_conf() -> Path:
    """pip inside the build trusts what this machine's pip trusts (its CA bundle, its index)."""
    conf = cache_root() / "buildah" / "pip.conf"
    lines = ["[global]", "cert = /etc/ssl/certs/ca-certificates.crt", "timeout = 180"]
    if os.environ.get("PIP_INDEX_URL"):
        lines.append(f"index-url = {os.environ['PIP_INDEX_URL']}")
    conf.write_text("\n".join(lines) + "\n")
    return conf


def go_image() -> BuiltImage:
    """This machine's Go toolchain (``/usr/local/go`` in the image, with empty ``/tmp`` and
    ``/etc``): the model store's build stage, as the official golang image would be (the stage
    runs ``go`` alone, in exec form, so it needs no shell or libc)."""
    goroot = Path(_run(["go", "env", "GOROOT"]).strip())
    version = _run(["go", "env", "GOVERSION"]).strip()
    name = f"{GO_IMAGE}:{version}"
    out = images_dir() / f"go-{version}.oci.tar"
    if out.exists():
        return BuiltImage(name, out, 0.0)
    t0 = time.monotonic()
    layer = out.with_suffix(".layer")

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        return info

    with tarfile.open(layer, "w", format=tarfile.PAX_FORMAT) as t:
        t.add(str(goroot), arcname="usr/local/go", filter=owned_by_root)
        # /tmp for the build, /etc for the resolv.conf and hosts buildah mounts in (the
        # module proxy, where the machine's module cache lacks something).
        for path, mode in (("tmp", 0o1777), ("etc", 0o755)):
            entry = tarfile.TarInfo(path)
            entry.type, entry.mode = tarfile.DIRTYPE, mode
            t.addfile(entry)
    try:
        oci_archive(
            layer,
            name,
            out,
            entrypoint=["/usr/local/go/bin/go"],
            user="",
            env=["PATH=/usr/local/go/bin:/usr/bin:/bin", "GOPATH=/go", "HOME=/root"],
        )
    finally:
        layer.unlink(missing_ok=True)
    return BuiltImage(name, out, time.monotonic() - t0)


def _go_cache_volumes() -> list[str]:
    """This machine's Go module and build caches, mounted where the Go image's ``go`` looks
    (GOPATH=/go, HOME=/root): the model store's build downloads and compiles only what the
    sandbox's own versitygw build has not."""
    mods = _run(["go", "env", "GOMODCACHE"]).strip()
    cache = _run(["go", "env", "GOCACHE"]).strip()
    Path(mods).mkdir(parents=True, exist_ok=True)
    Path(cache).mkdir(parents=True, exist_ok=True)
    return [f"--volume={mods}:/go/pkg/mod", f"--volume={cache}:/root/.cache/go-build"]


def dockerfile_image(
    dockerfile: Path,
    repository: str,
    base: BuiltImage,
    stages: dict[str, BuiltImage] | None = None,
    volumes: list[str] | None = None,
) -> BuiltImage:
    """``buildah bud`` of one of the project's Dockerfiles on the local base image
    (``PYTHON_IMAGE`` and ``BASE_IMAGE``); ``stages`` gives other local images by build
    argument (``GO_IMAGE``), ``volumes`` extra ``--volume`` flags for the build's RUN steps."""
    stages = stages or {}
    tag = context_digest(dockerfile)
    name = f"{repository}:{tag}"
    out = images_dir() / f"{repository.rsplit('/', 1)[-1]}-{tag}.oci.tar"
    if out.exists():
        return BuiltImage(name, out, 0.0)
    t0 = time.monotonic()
    env = _buildah_env()
    policy = _policy_flag()
    for local in (base, *stages.values()):
        _run(["buildah", "pull", policy, f"oci-archive:{local.archive}"], env=env)
        _run(["buildah", "tag", _image_id(local.archive, env), local.name], env=env)
    arg_flags = [f"--build-arg={arg}={local.name}" for arg, local in stages.items()]
    if "BASE_IMAGE=" in dockerfile.read_text():
        arg_flags.append(f"--build-arg=BASE_IMAGE={base.name}")
    ca = "/etc/ssl/certs/ca-certificates.crt"
    bud = [
        "buildah",
        "bud",
        policy,
        "--pull=never",
        "--network=host",
        "--isolation=chroot",
        "--layers=true",
        "--format=oci",
        f"--volume={ca}:{ca}:ro",
        f"--volume={_pip_conf()}:/etc/pip.conf:ro",
        *(volumes or []),
        f"--build-arg=PYTHON_IMAGE={base.name}",
        *arg_flags,
        "-f",
        str(dockerfile),
        "-t",
        name,
        ".",
    ]
    tmp = out.with_suffix(".partial")
    # buildah's storage is the machine's: a build of another checkout that produced the same
    # image (same layers, same id) may remove it with its own rmi between this build and its
    # push ("image not known"). Building again is then a cache hit; a few tries, then the error.
    for attempt in range(1, BUILD_TRIES + 1):
        tmp.unlink(missing_ok=True)
        try:
            _run(bud, env=env, cwd=REPO)
            _run(["buildah", "push", policy, name, f"oci-archive:{tmp}:{name}"], env=env)
            break
        except ImageBuildError as exc:
            if attempt == BUILD_TRIES or not removed_under_us(str(exc)):
                raise
            log.warning("%s was removed before its push (another checkout's build); again", name)
    tmp.replace(out)
    # The archive is the product; the local image only takes room. Its layers may be in use by
    # a build of another checkout running beside this one (buildah's storage is the machine's),
    # which makes rmi refuse: the image stays until a later build's rmi, and this one succeeds.
    try:
        _run(["buildah", "rmi", name], env=env)
    except ImageBuildError as exc:
        log.warning("kept the local image %s: %s", name, str(exc).splitlines()[-1])
    return BuiltImage(name, out, time.monotonic() - t0)


def _image_id(archive: Path, env: dict[str, str]) -> str:
    """The id buildah gave an image pulled from ``archive`` (its config digest)."""
    with tarfile.open(archive) as t:
        index = json.load(t.extractfile("index.json"))
        manifest_digest = index["manifests"][0]["digest"].split(":")[1]
        manifest = json.load(t.extractfile(f"blobs/sha256/{manifest_digest}"))
    return str(manifest["config"]["digest"].split(":")[1])


@dataclass(frozen=True)
class ProjectImages:
    pause: BuiltImage
    coredns: BuiltImage
    base: BuiltImage
    operator: BuiltImage
    runtime_cpu: BuiltImage
    modelstore: BuiltImage

    def all(self) -> list[BuiltImage]:
        """In the order the node imports them."""
        return [
            self.pause, self.coredns, self.base, self.operator, self.runtime_cpu, self.modelstore
        ]  # fmt: skip

    def archives(self) -> list[Path]:
        return [image.archive for image in self.all()]

    def names(self) -> list[str]:
        return [image.name for image in self.all()]

    def timings(self) -> dict[str, float]:
        return {
            k: round(getattr(self, k).seconds, 1)
            for k in ("pause", "coredns", "base", "operator", "runtime_cpu", "modelstore")
        }


# Image kind (images/<kind>.Dockerfile, tidal.common.release's kinds) -> local repository.
LOCAL_REPOSITORIES = {
    "operator": OPERATOR_IMAGE,
    "runtime-cpu": RUNTIME_CPU_IMAGE,
    "modelstore": MODELSTORE_IMAGE,
}


def project_image(kind: str, base: BuiltImage) -> BuiltImage:
    """One of the project's images by kind, built (or reused) from images/<kind>.Dockerfile."""
    dockerfile = REPO / "images" / f"{kind}.Dockerfile"
    if kind == "modelstore":
        stages = {"GO_IMAGE": go_image()}
        return dockerfile_image(dockerfile, MODELSTORE_IMAGE, base, stages, _go_cache_volumes())
    return dockerfile_image(dockerfile, LOCAL_REPOSITORIES[kind], base)


def build_project_images(node_bin: Path) -> ProjectImages:
    from .realnode import PAUSE_IMAGE

    base = base_image()
    built = ProjectImages(
        pause=binary_image(node_bin / "pause", PAUSE_IMAGE),
        coredns=binary_image(node_bin / "coredns", "localhost/tidal/coredns:sandbox"),
        base=base,
        operator=project_image("operator", base),
        runtime_cpu=project_image("runtime-cpu", base),
        modelstore=project_image("modelstore", base),
    )
    prune_archives(keep=set(built.archives()))
    return built


def prune_archives(keep: set[Path], per_kind: int = KEPT_PER_KIND) -> list[Path]:
    """Drop cached archives beyond the ``per_kind`` most recently used of each kind (the
    name before the digest), never one in ``keep``: every source change builds two new
    images, and the cache would otherwise grow by about 300 MB a change."""
    for path in keep:
        path.touch(exist_ok=True)  # "recently used" is the modification time
    kinds: dict[str, list[Path]] = {}
    for path in images_dir().glob("*.oci.tar"):
        kinds.setdefault(path.name.rsplit("-", 1)[0], []).append(path)
    dropped = []
    for paths in kinds.values():
        paths.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for path in paths[per_kind:]:
            if path not in keep:
                path.unlink(missing_ok=True)
                dropped.append(path)
    return dropped

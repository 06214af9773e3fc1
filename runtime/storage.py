"""Cold storage: fetch engine files to local disk and verify their sha256.

Schemes: ``file://`` and plain paths (read in place), ``http://`` and ``https://`` (downloaded
into the cache directory, streamed through the hash).  Blocking; called from worker threads.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from tidal.runtime.errors import EngineLoadError

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def local_path(uri: str) -> Path | None:
    """The local path of a file:// URI or plain path; None for remote URIs."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        return Path(urllib.parse.unquote(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    return None


class EngineStore:
    """Fetches engines; remembers verified local copies of remote ones."""

    def __init__(self, cache_dir: str | None) -> None:
        # Made on the first download, not here: a runtime serving only file:// engines creates
        # nothing (the operator always names a cache directory, the pod's engine-cache volume).
        self.cache_dir = Path(cache_dir or tempfile.mkdtemp(prefix="tidal-engines-"))

    def host_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.cache_dir.glob("*") if p.is_file())

    def fetch(self, uri: str, sha256: str | None) -> Path:
        path = local_path(uri)
        if path is not None:
            if not path.is_file():
                raise EngineLoadError(f"engine file {uri} does not exist")
            if sha256 is not None:
                actual = sha256_file(path)
                if actual != sha256:
                    raise EngineLoadError(
                        f"engine file {uri} is corrupt or not the configured one: "
                        f"sha256 {actual}, expected {sha256}"
                    )
            return path
        scheme = urllib.parse.urlparse(uri).scheme
        if scheme not in ("http", "https"):
            raise EngineLoadError(f"engine URI {uri}: unsupported scheme {scheme!r}")
        return self._download(uri, sha256)

    def _download(self, uri: str, sha256: str | None) -> Path:
        key = sha256 or hashlib.sha256(uri.encode()).hexdigest()
        name = urllib.parse.urlparse(uri).path.rsplit("/", 1)[-1] or "engine"
        target = self.cache_dir / f"{key[:16]}-{name}"
        if target.is_file() and sha256 is not None and sha256_file(target) == sha256:
            return target
        digest = hashlib.sha256()
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            fd, partial = tempfile.mkstemp(dir=self.cache_dir, suffix=".partial")
        except OSError as exc:
            raise EngineLoadError(
                f"cannot write to the engine cache {self.cache_dir}: {exc} (it must be writable "
                "by the runtime's user, uid 65532)"
            ) from None
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(uri, timeout=60) as response:
                while chunk := response.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            if sha256 is not None and digest.hexdigest() != sha256:
                raise EngineLoadError(
                    f"engine download {uri} is corrupt or not the configured one: "
                    f"sha256 {digest.hexdigest()}, expected {sha256}"
                )
            Path(partial).replace(target)
        except (urllib.error.URLError, OSError) as exc:
            raise EngineLoadError(f"cannot download engine {uri}: {exc}") from None
        finally:
            Path(partial).unlink(missing_ok=True)
        return target

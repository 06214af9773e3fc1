"""Cold storage: fetch engine files to local disk and verify their sha256.

Schemes: ``file://`` and plain paths (read in place), ``http://`` and ``https://`` (downloaded
into the cache directory, streamed through the hash), ``s3://bucket/key`` (an S3-compatible
object store through obstore, the Rust ``object_store`` crate's Python binding: retries with
backoff are its own, and an object larger than one part is read as ranged GETs, at most
``S3Spec.concurrency`` at once, written and hashed in order so that memory stays bounded by
twice the window).  Blocking; called from worker threads.

A download is written to a ``*.partial`` file that its fetch holds an exclusive ``flock`` on
until it is renamed into place: a partial nobody holds was left by a runtime that died mid-fetch
(the kernel drops the lock with the process), so :meth:`EngineStore.remove_stale_partials`
removes it, at start and before each download, while the partials of another runtime sharing
the node cache stay; partials never count as cached bytes.  :meth:`EngineStore.close` (the
shutdown) cancels the fetches under way: each stops at its next chunk, an HTTP read blocked on
a stalled store is woken by shutting its socket down, and their partials are removed at once.

A download's sha256 is computed on a thread of its own (:class:`BackgroundDigest`) while the
bytes are received and written: hashlib, file writes and obstore's reads all release the GIL, so
verification overlaps the transfer instead of adding to it (hashing alone runs at about 2 GB/s
on a core, as fast as a loopback GET). Bytes travel as obstore's buffers of about ``CHUNK``
(memoryviews, never copied into ``bytes``): larger chunks cost more than they save, since the
client concatenates the network's small reads into each one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import logging
import os
import queue
import socket
import tempfile
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ..common.clock import CLOCK
from .config import S3Spec
from .errors import EngineLoadError

if TYPE_CHECKING:
    from obstore.store import ClientConfig, RetryConfig, S3Config

CHUNK = 1 << 20
PARTIAL = ".partial"  # a download under way (or left by a runtime that died)
NEW = ".new"  # a partial not locked yet: a moment's name, then PARTIAL
# A NEW file nobody holds, older than this, was left by a runtime killed between creating and
# locking it (it is empty).
NEW_STALE_SECONDS = 60.0
# Chunks the hasher may lag behind the writer (memory: about HASH_LAG x CHUNK).
HASH_LAG = 32
Chunk = bytes | memoryview  # a part of an object, as the hash and the file take it
T = TypeVar("T")

log = logging.getLogger("tidal.runtime.storage")


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


def split_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key) of ``s3://bucket/key``; EngineLoadError naming the URI otherwise."""
    parsed = urllib.parse.urlparse(uri)
    key = urllib.parse.unquote(parsed.path.lstrip("/"))
    if parsed.scheme != "s3" or not parsed.netloc or not key or key.endswith("/"):
        raise EngineLoadError(f"engine URI {uri}: expected s3://bucket/key")
    return parsed.netloc, key


def part_ranges(size: int, part: int) -> list[tuple[int, int]]:
    """[start, end) byte ranges of at most ``part`` bytes covering ``size`` bytes."""
    return [(start, min(start + part, size)) for start in range(0, size, part)]


class BackgroundDigest:
    """A sha256 computed on its own thread from the chunks given to :meth:`update`, in order;
    at most ``lag`` chunks wait for it (``update`` blocks beyond that). A context manager: the
    thread always ends with the block."""

    def __init__(self, lag: int = HASH_LAG) -> None:
        self._queue: queue.Queue[Chunk | None] = queue.Queue(lag)
        self._digest = hashlib.sha256()
        self._thread = threading.Thread(target=self._run, name="tidal-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            self._digest.update(chunk)

    def update(self, chunk: Chunk) -> None:
        self._queue.put(chunk)

    def hexdigest(self) -> str:
        """The digest of every chunk given (waits for the hasher to finish)."""
        self._finish()
        return self._digest.hexdigest()

    def _finish(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> BackgroundDigest:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._finish()


def in_order(
    fetch: Callable[[int, int], T], ranges: list[tuple[int, int]], workers: int
) -> Iterator[T]:
    """Fetch ``ranges`` with up to ``workers`` requests at once, yielding their bytes in order
    (at most ``2 * workers`` parts are held: the window of requests and what waits behind the
    first)."""
    window = 2 * workers
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tidal-s3")
    pending: deque[Future[T]] = deque()
    queued = iter(ranges)
    try:
        for start, end in queued:
            pending.append(pool.submit(fetch, start, end))
            if len(pending) >= window:
                break
        while pending:
            data = pending.popleft().result()
            nxt = next(queued, None)
            if nxt is not None:
                pending.append(pool.submit(fetch, *nxt))
            yield data
    finally:
        # Not waiting for the parts still being read: after a failure or a cancelled fetch,
        # one stalled in the store must not hold the fetch (or the shutdown) up.
        pool.shutdown(wait=False, cancel_futures=True)


class EngineStore:
    """Fetches engines; remembers verified local copies of remote ones."""

    def __init__(self, cache_dir: str | None, s3: S3Spec | None = None) -> None:
        # Made on the first download, not here: a runtime serving only file:// engines creates
        # nothing (the operator always names a cache directory, the pod's engine-cache volume).
        self.cache_dir = Path(cache_dir or tempfile.mkdtemp(prefix="tidal-engines-"))
        self.s3 = s3 or S3Spec()
        self._s3_stores: dict[str, Any] = {}
        self._s3_lock = threading.Lock()
        # The fetches under way: their partial files and their HTTP sockets (close() cancels).
        self._closed = threading.Event()
        self._live_lock = threading.Lock()
        self._partials: set[Path] = set()
        self._sockets: set[socket.socket] = set()

    def host_bytes(self) -> int:
        """Bytes of the finished engine files in the cache (downloads under way not counted)."""
        total = 0
        for path in self.cache_dir.glob("*"):
            if _in_progress(path.name):
                continue
            with contextlib.suppress(OSError):  # removed meanwhile
                if path.is_file():
                    total += path.stat().st_size
        return total

    def remove_stale_partials(self) -> list[str]:
        """Remove the partial downloads that no live fetch holds (left in the cache by a runtime
        that died mid-fetch); returns their names. Those of another runtime sharing this cache
        are held (locked) by their fetch and stay."""
        removed: list[str] = []
        try:
            paths = sorted(self.cache_dir.iterdir())
        except OSError:  # no cache yet
            return removed
        with self._live_lock:
            ours = set(self._partials)
        for path in paths:
            # Our own fetches are skipped without opening their files: on NFS, where flock is
            # emulated with POSIX locks, opening and closing one would release its lock.
            if _in_progress(path.name) and path not in ours:
                with contextlib.suppress(OSError):  # gone meanwhile, or not ours to remove
                    if _remove_if_unheld(path):
                        removed.append(path.name)
        if removed:
            log.info("removed %d partial download(s) no runtime owns: %s", len(removed), removed)
        return removed

    def close(self) -> None:
        """Cancel the fetches under way (the runtime is shutting down): each stops at its next
        chunk, an HTTP read blocked on a stalled store is woken now, and their partial files are
        removed now. A read blocked inside the S3 client ends with its own timeouts, or with the
        process."""
        self._closed.set()
        with self._live_lock:
            sockets, partials = list(self._sockets), list(self._partials)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for partial in partials:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)

    def _check_open(self, uri: str) -> None:
        if self._closed.is_set():
            raise EngineLoadError(f"fetch of engine {uri} cancelled: the runtime is shutting down")

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
        if scheme == "s3":
            return self._download(uri, sha256, self._s3_chunks)
        if scheme not in ("http", "https"):
            raise EngineLoadError(f"engine URI {uri}: unsupported scheme {scheme!r}")
        return self._download(uri, sha256, self._http_chunks)

    # -- sources: each yields the object's bytes in order, raising EngineLoadError ------------

    def _http_chunks(self, uri: str) -> Iterator[Chunk]:
        try:
            with urllib.request.urlopen(uri, timeout=60) as response:
                sock = _socket_of(response)
                self._watch(sock, True)
                expected, received = response.length, 0
                try:
                    while chunk := response.read(CHUNK):
                        received += len(chunk)
                        yield chunk
                finally:
                    self._watch(sock, False)
                self._check_open(uri)
                if expected is not None and received < expected:
                    # http.client ends a body cut short without an error: the bytes would be
                    # taken for the engine (and, without a sha256, loaded).
                    raise EngineLoadError(
                        f"cannot download engine {uri}: the connection ended after {received} "
                        f"of {expected} bytes"
                    )
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            self._check_open(uri)  # a socket shut down by close(): say so, not "reset"
            raise EngineLoadError(f"cannot download engine {uri}: {exc}") from None

    def _watch(self, sock: socket.socket | None, live: bool) -> None:
        """Track the socket of an HTTP fetch, so that close() can wake a blocked read."""
        if sock is None:
            return
        with self._live_lock:
            if live:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)
        if live and self._closed.is_set():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _s3_store(self, bucket: str) -> Any:
        with self._s3_lock:
            store = self._s3_stores.get(bucket)
            if store is None:
                store = self._s3_stores[bucket] = make_s3_store(self.s3, bucket)
            return store

    def _s3_chunks(self, uri: str) -> Iterator[Chunk]:
        import obstore
        from obstore.exceptions import BaseError

        bucket, key = split_s3_uri(uri)
        where = f"s3://{bucket}/{key} at {self.s3.endpoint or 'AWS ' + self.s3.region}"
        try:
            store = self._s3_store(bucket)
            size = int(obstore.head(store, key)["size"])
            if size <= self.s3.part_bytes or self.s3.concurrency == 1:
                for chunk in obstore.get(store, key).stream(min_chunk_size=CHUNK):
                    yield memoryview(chunk)
                return

            # A part arrives as the network's chunks (no buffer of a whole part to allocate
            # and fault in), given to the hash and the file as they are.
            def fetch(start: int, end: int) -> list[memoryview]:
                got = obstore.get(store, key, options={"range": (start, end)})
                return [memoryview(c) for c in got.stream(min_chunk_size=CHUNK)]

            workers = self.s3.concurrency
            for part in in_order(fetch, part_ranges(size, self.s3.part_bytes), workers):
                yield from part
        except (BaseError, OSError, ValueError) as exc:
            raise EngineLoadError(f"cannot read engine {where}: {s3_reason(exc)}") from None

    def _download(
        self, uri: str, sha256: str | None, chunks: Callable[[str], Iterator[Chunk]]
    ) -> Path:
        key = sha256 or hashlib.sha256(uri.encode()).hexdigest()
        name = urllib.parse.urlparse(uri).path.rsplit("/", 1)[-1] or "engine"
        target = self.cache_dir / f"{key[:16]}-{name}"
        if target.is_file() and sha256 is not None and sha256_file(target) == sha256:
            return target
        self._check_open(uri)
        fd = -1
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            self.remove_stale_partials()
            # Locked before it takes the partial name, so that no other runtime's sweep ever
            # sees it unheld while it is alive; the lock goes with the process.
            fd, new = tempfile.mkstemp(dir=self.cache_dir, prefix=".tidal-", suffix=NEW)
            fcntl.flock(fd, fcntl.LOCK_EX)
            partial = Path(new[: -len(NEW)] + PARTIAL)
            with self._live_lock:
                self._partials.add(partial)  # ours before it bears the name
            Path(new).rename(partial)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
                with self._live_lock:
                    self._partials.discard(Path(new[: -len(NEW)] + PARTIAL))
                Path(new).unlink(missing_ok=True)
            raise EngineLoadError(
                f"cannot write to the engine cache {self.cache_dir}: {exc} (it must be writable "
                "by the runtime's user, uid 65532)"
            ) from None
        try:
            with os.fdopen(fd, "wb") as out, BackgroundDigest() as digest:
                for chunk in chunks(uri):
                    self._check_open(uri)
                    digest.update(chunk)
                    out.write(chunk)
                actual = digest.hexdigest()
                if sha256 is not None and actual != sha256:
                    raise EngineLoadError(
                        f"engine download {uri} is corrupt or not the configured one: "
                        f"sha256 {actual}, expected {sha256}"
                    )
                self._check_open(uri)
                partial.replace(target)  # still locked: a sweep never takes it for stale
        except OSError as exc:
            raise EngineLoadError(f"cannot download engine {uri}: {exc}") from None
        finally:
            with self._live_lock:
                self._partials.discard(partial)
            partial.unlink(missing_ok=True)
        return target


def _in_progress(name: str) -> bool:
    """A download's file (under way, or left by a runtime that died), not a cached engine.

    Cached engines are named ``<16 hex digits>-<name>``; downloads ``.tidal-*.partial`` (and
    ``tmp*.partial`` before v0.5), so an engine whose own name ends in ``.partial`` is not one."""
    if name.startswith(".tidal-"):
        return name.endswith((PARTIAL, NEW))
    return name.startswith("tmp") and name.endswith(PARTIAL)


def _remove_if_unheld(path: Path) -> bool:
    """Remove ``path``, a download's file, when no fetch holds its lock (its owner is dead)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live fetch, of this runtime or another one on the node
        held = os.fstat(fd)
        if path.name.endswith(NEW) and CLOCK.wall() - held.st_mtime < NEW_STALE_SECONDS:
            return False  # created a moment ago, about to be locked by its fetch
        if path.stat().st_ino != held.st_ino:
            return False  # renamed into place (or replaced) since it was opened
        path.unlink()
        return True
    finally:
        os.close(fd)


def _socket_of(response: Any) -> socket.socket | None:
    """The socket under a urllib response (http.client keeps it behind ``fp.raw._sock``; None
    where it does not)."""
    sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


def make_s3_store(spec: S3Spec, bucket: str, prefix: str | None = None) -> Any:
    """An obstore S3Store for ``bucket`` (keys under ``prefix``) as ``spec`` describes the
    store; the engine store reads with it, the builder (tidal.runtime.builder) writes with it."""
    from obstore.store import S3Store  # only processes that touch s3:// load it

    config: S3Config = {
        "region": spec.region,
        "virtual_hosted_style_request": not spec.path_style,
    }
    if spec.endpoint:
        config["endpoint"] = spec.endpoint.rstrip("/")
    retry: RetryConfig = {
        "max_retries": spec.max_retries,
        "backoff": {"init_backoff": timedelta(milliseconds=100), "base": 2},
        "retry_timeout": timedelta(seconds=120),
    }
    client: ClientConfig = {"allow_http": bool(spec.endpoint and spec.endpoint.startswith("http:"))}
    # Credentials: the standard AWS variables or the ambient chain (obstore reads AWS_* from
    # the environment itself).
    return S3Store(bucket, prefix=prefix, config=config, client_options=client, retry_config=retry)


def s3_reason(exc: BaseException) -> str:
    """The store's answer in a line: what obstore reports, less its Debug dump of the request,
    led by what a user should check."""
    from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

    text = " ".join(str(exc).split("\n\nDebug source:", 1)[0].split())[:400]
    if isinstance(exc, FileNotFoundError):
        return f"no such bucket or key: {text}"
    if isinstance(exc, PermissionDeniedError):
        return (
            "access denied: the store refused the credentials or its policy forbids reading "
            f"(check the credentials Secret and the bucket policy): {text}"
        )
    if isinstance(exc, UnauthenticatedError):
        return f"the store refused the credentials (check the credentials Secret): {text}"
    return text

"""Engine bytes from a local file to the GPU at the hardware's speed, verified by chunk (issue 46).

The file is read in fixed chunks (64 MiB, aligned to the file's start) by a pool of threads,
each ``os.preadv`` into one buffer of a ring of page-locked (pinned) host buffers; as each
chunk arrives in order, its part of the weight region is copied to the device on a copy stream
(``cudaMemcpyAsync`` from pinned memory, the DMA engine's full rate) while the threads read the
next chunks into the other buffers.  A buffer goes back to the ring when the copy's event has
completed.  So reading, verifying and copying overlap, and the load runs at the slowest of the
three rather than their sum.

Verification.  The builder's manifest records a sha256 per 64 MiB chunk of the file beside the
whole-file sha256 (:func:`chunk_sha256_file`, :class:`ChunkDigests`); with those, each reader
thread hashes the chunk it has just read (``hashlib`` releases the GIL on large buffers), so
every core verifies, overlapped with the transfer, and a mismatch names the chunk.  Only the
chunks a load reads are hashed unless ``verify_whole_file`` asks for them all.  A single
user-given sha256 over the whole file still works (:func:`stage_to_device` ``whole_sha256``):
it is one running hash, updated in file order on the thread that issues the copies, so it runs
at one core's sha256 rate (~1.5-2 GB/s on the machines here) and caps the load at that.

The chunk planning and the digest record are plain data (:func:`plan_chunks`,
:class:`ChunkDigests`), tested without a GPU; torch is passed in by the caller, never imported
here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHUNK_BYTES = 64 << 20
DIGEST_ALGORITHM = "sha256"


def default_threads() -> int:
    """Reader threads: every core (reads from the page cache are memory copies, and each thread
    also hashes what it read), at least 4 (a cold disk wants several requests in flight)."""
    return max(4, os.cpu_count() or 1)


class StagingError(RuntimeError):
    """The file is shorter than its manifest says, or a chunk's digest does not match."""


@dataclass(frozen=True)
class Chunk:
    """One chunk of the file: where it is, and which part of it goes to the device.

    ``copy_from``/``copy_bytes`` are the offset within the chunk and the length of its overlap
    with the weight region (0 bytes: the chunk is read only to be verified); ``copy_to`` is
    where that overlap lands in the device region."""

    index: int
    file_offset: int
    nbytes: int
    copy_from: int
    copy_bytes: int
    copy_to: int


def plan_chunks(
    file_bytes: int,
    region_offset: int,
    region_bytes: int,
    chunk_bytes: int = CHUNK_BYTES,
    whole_file: bool = False,
) -> list[Chunk]:
    """The chunks to read for the region ``[region_offset, region_offset + region_bytes)`` of a
    file of ``file_bytes``: the file's fixed chunks (so they match the builder's digests) that
    overlap the region, or every chunk of the file when ``whole_file``."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk size {chunk_bytes} must be positive")
    if region_offset < 0 or region_bytes < 0 or region_offset + region_bytes > file_bytes:
        raise ValueError(
            f"region [{region_offset}, {region_offset + region_bytes}) is outside the file's "
            f"{file_bytes} bytes"
        )
    end = region_offset + region_bytes
    chunks = []
    for index, start in enumerate(range(0, file_bytes, chunk_bytes)):
        stop = min(start + chunk_bytes, file_bytes)
        lo, hi = max(start, region_offset), min(stop, end)
        overlap = max(0, hi - lo)
        if overlap == 0 and not whole_file:
            continue
        chunks.append(
            Chunk(
                index=index,
                file_offset=start,
                nbytes=stop - start,
                copy_from=lo - start if overlap else 0,
                copy_bytes=overlap,
                copy_to=lo - region_offset if overlap else 0,
            )
        )
    return chunks


@dataclass(frozen=True)
class ChunkDigests:
    """The sha256 of each fixed-size chunk of a file, as the builder's manifest records them."""

    chunk_bytes: int
    file_bytes: int
    sha256: tuple[str, ...]

    def __post_init__(self) -> None:
        want = -(-self.file_bytes // self.chunk_bytes) if self.chunk_bytes > 0 else -1
        if len(self.sha256) != want:
            raise ValueError(
                f"{len(self.sha256)} chunk digests for {self.file_bytes} bytes in chunks of "
                f"{self.chunk_bytes}: expected {want}"
            )

    def mismatch(self, index: int, data: Any) -> str | None:
        """Why chunk ``index``'s bytes are not what the manifest says; None if they are."""
        actual = hashlib.sha256(data).hexdigest()
        if actual != self.sha256[index]:
            return (
                f"chunk {index} (bytes {index * self.chunk_bytes}..) has sha256 {actual}, "
                f"the manifest says {self.sha256[index]}"
            )
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "chunkBytes": self.chunk_bytes,
            "fileBytes": self.file_bytes,
            "algorithm": DIGEST_ALGORITHM,
            "sha256": list(self.sha256),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChunkDigests:
        if data.get("algorithm", DIGEST_ALGORITHM) != DIGEST_ALGORITHM:
            raise ValueError(f"chunk digests: unknown algorithm {data.get('algorithm')!r}")
        return cls(int(data["chunkBytes"]), int(data["fileBytes"]), tuple(data["sha256"]))


def _read_exact(fd: int, view: memoryview, offset: int, path: Path) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got <= 0:
            raise StagingError(f"{path.name}: the file ended at byte {offset + done}")
        done += got


def chunk_sha256_file(
    path: Path, chunk_bytes: int = CHUNK_BYTES, threads: int | None = None
) -> ChunkDigests:
    """The per-chunk sha256 of ``path``, chunks hashed in parallel (for the builder's manifest)."""
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:

        def digest(start: int) -> str:
            buffer = bytearray(min(chunk_bytes, size - start))
            _read_exact(fd, memoryview(buffer), start, path)
            return hashlib.sha256(buffer).hexdigest()

        starts = range(0, size, chunk_bytes)
        with ThreadPoolExecutor(max_workers=max(1, threads or default_threads())) as pool:
            digests = tuple(pool.map(digest, starts))
    finally:
        os.close(fd)
    return ChunkDigests(chunk_bytes, size, digests)


class PinnedRing:
    """A ring of page-locked host buffers of one chunk each, made once and reused by every load
    (page-locking memory costs far more than copying into it: a fresh 1 GiB pinned buffer per
    load was most of the 1.0-1.5 GB/s that issue 46 measured)."""

    def __init__(self, torch: Any, buffers: int, chunk_bytes: int = CHUNK_BYTES) -> None:
        self._torch = torch
        self.chunk_bytes = chunk_bytes
        self.tensors: list[Any] = []
        self.views: list[memoryview] = []
        self.grow(buffers)

    def grow(self, buffers: int) -> None:
        """At least ``buffers`` buffers (a ring in use must not grow: one load at a time)."""
        torch = self._torch
        while len(self.tensors) < buffers:
            tensor = torch.empty(self.chunk_bytes, dtype=torch.uint8, pin_memory=True)
            self.tensors.append(tensor)
            self.views.append(memoryview(tensor.numpy()))

    @property
    def nbytes(self) -> int:
        return self.chunk_bytes * len(self.tensors)


@dataclass(frozen=True)
class StageReport:
    """What one staging did: bytes read and copied, chunks verified, seconds."""

    read_bytes: int
    copied_bytes: int
    verified_chunks: int
    seconds: float


def stage_to_device(
    torch: Any,
    path: Path,
    region_offset: int,
    target: Any,
    ring: PinnedRing,
    stream: Any,
    *,
    digests: ChunkDigests | None = None,
    verify_whole_file: bool = False,
    whole_sha256: str | None = None,
    threads: int | None = None,
    clock: Any = None,
) -> StageReport:
    """Fill the device tensor ``target`` (uint8, contiguous) with the file's bytes
    ``[region_offset, region_offset + target.numel())``, reading through ``ring`` and copying on
    ``stream``; verified by ``digests`` per chunk and/or ``whole_sha256`` over the whole file
    (which reads every chunk).  Returns when the last copy has completed."""
    import time

    now = clock or time.perf_counter
    started = now()
    size = path.stat().st_size
    if digests is not None and digests.file_bytes != size:
        raise StagingError(
            f"{path.name} has {size} bytes, its chunk digests cover {digests.file_bytes}"
        )
    chunk_bytes = digests.chunk_bytes if digests is not None else ring.chunk_bytes
    if chunk_bytes > ring.chunk_bytes:
        raise StagingError(f"chunks of {chunk_bytes}B do not fit the ring's {ring.chunk_bytes}B")
    whole = whole_sha256 is not None or (digests is not None and verify_whole_file)
    chunks = plan_chunks(size, region_offset, int(target.numel()), chunk_bytes, whole)
    running = hashlib.sha256() if whole_sha256 is not None else None
    fd = os.open(path, os.O_RDONLY)
    free = list(range(len(ring.tensors)))
    pending: deque[tuple[Chunk, int, Future[None]]] = deque()
    copying: deque[tuple[Any, int]] = deque()
    verified = 0

    def read(chunk: Chunk, slot: int) -> None:
        view = ring.views[slot][: chunk.nbytes]
        _read_exact(fd, view, chunk.file_offset, path)
        if digests is not None:
            why = digests.mismatch(chunk.index, view)
            if why is not None:
                raise StagingError(f"{path.name}: {why}")

    try:
        with ThreadPoolExecutor(max_workers=max(1, threads or default_threads())) as pool:
            todo = iter(chunks)
            exhausted = False
            while True:
                while free and not exhausted:
                    chunk = next(todo, None)
                    if chunk is None:
                        exhausted = True
                        break
                    slot = free.pop()
                    pending.append((chunk, slot, pool.submit(read, chunk, slot)))
                if not pending:
                    if copying and not exhausted:
                        copying[0][0].synchronize()  # the ring is empty: wait for a copy
                        free.append(copying.popleft()[1])
                        continue
                    break
                chunk, slot, future = pending.popleft()
                future.result()
                if digests is not None:
                    verified += 1
                if running is not None:
                    running.update(ring.views[slot][: chunk.nbytes])
                if chunk.copy_bytes:
                    with torch.cuda.stream(stream):
                        source = ring.tensors[slot][chunk.copy_from :]
                        target[chunk.copy_to : chunk.copy_to + chunk.copy_bytes].copy_(
                            source[: chunk.copy_bytes],
                            non_blocking=True,
                        )
                        event = torch.cuda.Event()
                        event.record(stream)
                    copying.append((event, slot))
                else:
                    free.append(slot)
                while copying and copying[0][0].query():
                    free.append(copying.popleft()[1])
            stream.synchronize()
    finally:
        # The pool has ended (its reads with it); a copy still in flight must finish before
        # the ring's buffers are written again by the next load.
        with contextlib.suppress(Exception):
            stream.synchronize()
        os.close(fd)
    if running is not None and running.hexdigest() != whole_sha256:
        raise StagingError(f"{path.name}: sha256 {running.hexdigest()}, expected {whole_sha256}")
    return StageReport(
        read_bytes=sum(c.nbytes for c in chunks),
        copied_bytes=sum(c.copy_bytes for c in chunks),
        verified_chunks=verified,
        seconds=now() - started,
    )


def ring_buffers_for(threads: int) -> int:
    """Ring size: one buffer per reader thread plus a few in flight to the device."""
    return threads + 4


def copy_offsets(chunks: Sequence[Chunk]) -> list[tuple[int, int]]:
    """The device ranges the chunks fill, in order (for tests: they tile the region)."""
    return [(c.copy_to, c.copy_to + c.copy_bytes) for c in chunks if c.copy_bytes]

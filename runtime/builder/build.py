"""One build, end to end: fetch the source and the data sets, make each engine the spec asks
for, gate it against the FP32 reference, and publish what passed under the naming scheme.
The backend (ONNX Runtime, torch AOTInductor or TensorRT, :func:`engine_maker`) makes and runs the
engines; everything else here is the same for both.

Destinations are obstore stores (``LocalStore`` for a directory, ``S3Store`` for
``s3://bucket/prefix``): one code path for both, the store's construction the only difference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ...common.clock import CLOCK, Clock, utc_timestamp
from ..backends.staging import chunk_sha256_file
from ..config import S3Spec
from ..errors import EngineLoadError
from ..storage import EngineStore, local_path, make_s3_store, sha256_file
from .gate import AccuracyMetrics, GateVerdict, Reference, RefusedBeforeBuild, judge, measure
from .plan import (
    MANIFEST,
    DataRecord,
    FileRecord,
    Manifest,
    accuracy_record,
    artifact_prefix,
    build_key,
    differences,
    engine_file_name,
    key_inputs,
)
from .spec import BuildError, BuildSpec


class FetchError(BuildError):
    """An input could not be read from its store (the message names the spec field)."""


class ArtifactConflict(BuildError):
    """The destination already holds a published engine of this model version built from other
    inputs; published engines are immutable (publish a new version)."""


class GateRefused(BuildError):
    """At least one engine lost more than the accuracy gate allows; it was not published."""


class Destination:
    """Where a build writes: relative keys under a local directory or an S3 prefix."""

    def __init__(self, store: Any, base_uri: str) -> None:
        self._store = store
        self.base_uri = base_uri.rstrip("/")

    @classmethod
    def open(cls, output: str, s3: S3Spec) -> Destination:
        if output.startswith("s3://"):
            bucket, _, prefix = output[len("s3://") :].partition("/")
            prefix = prefix.strip("/")
            return cls(make_s3_store(s3, bucket, prefix or None), output)
        from obstore.store import LocalStore

        path = local_path(output)
        assert path is not None  # the spec admits only local paths and s3://
        root = path.resolve()
        return cls(LocalStore(root, mkdir=True), root.as_uri())

    def uri(self, key: str) -> str:
        return f"{self.base_uri}/{key}"

    def read(self, key: str) -> bytes | None:
        import obstore

        try:
            return bytes(obstore.get(self._store, key).bytes())
        except FileNotFoundError:
            return None

    def size(self, key: str) -> int | None:
        import obstore

        try:
            return int(obstore.head(self._store, key)["size"])
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes | Path) -> None:
        import obstore

        obstore.put(self._store, key, data)


@dataclass(frozen=True)
class Artifact:
    """One engine of the build: published (or refused), built now or reused."""

    precision: str
    manifest_uri: str
    engine_uri: str | None  # None when refused: nothing loadable is written
    manifest: Manifest
    reused: bool

    @classmethod
    def at(
        cls,
        destination: Destination,
        prefix: str,
        file_name: str,
        manifest: Manifest,
        *,
        reused: bool,
    ) -> Artifact:
        """The engine whose manifest sits under ``prefix`` of ``destination``."""
        engine_uri = destination.uri(f"{prefix}/{file_name}") if manifest.published else None
        manifest_uri = destination.uri(f"{prefix}/{MANIFEST}")
        return cls(manifest.precision, manifest_uri, engine_uri, manifest, reused)

    @property
    def published(self) -> bool:
        return self.manifest.published

    def describe(self) -> str:
        state = "published" if self.published else "REFUSED"
        how = (
            "reused (same build key)"
            if self.reused
            else f"built in {self.manifest.build_seconds:.2f}s"
        )
        where = self.engine_uri or self.manifest_uri
        return f"{self.precision}: {state}, {how}: {where}\n    {self.manifest.accuracy.reason}"


@dataclass(frozen=True)
class BuildReport:
    artifacts: tuple[Artifact, ...]

    @property
    def refused(self) -> tuple[Artifact, ...]:
        return tuple(a for a in self.artifacts if not a.published)

    def raise_for_refusal(self) -> None:
        if self.refused:
            raise GateRefused(
                "the accuracy gate refused "
                + "; ".join(
                    f"{a.manifest.model}/{a.manifest.version} {a.precision} "
                    f"({a.manifest.accuracy.reason})"
                    for a in self.refused
                )
            )


def file_record(path: Path) -> FileRecord:
    """The published file's record: its sha256 and its per-chunk sha256 (issue 46)."""
    chunks = chunk_sha256_file(path)
    return FileRecord(
        name=path.name,
        sha256=sha256_file(path),
        size_bytes=path.stat().st_size,
        chunk_bytes=chunks.chunk_bytes,
        chunk_sha256=list(chunks.sha256),
    )


def _fetch(store: EngineStore, uri: str, sha256: str | None, field: str) -> Path:
    try:
        return store.fetch(uri, sha256)
    except EngineLoadError as exc:
        raise FetchError(f"{field}: {exc.message}") from None


class EngineMaker(Protocol):
    """One backend's part of a build (:class:`.onnxrt.OnnxRuntimeMaker`,
    :class:`.aoti.TorchAOTIMaker`, :class:`.tensorrt.TensorRTMaker`): the reference, each
    engine, each engine's outputs."""

    def libraries(self) -> dict[str, str]: ...

    def reference(self, source: Path, validation_file: Path) -> Reference: ...

    def make(self, precision: str, engine: Path, calibration_file: Path | None) -> int | None: ...

    def evaluate(self, engine: Path, precision: str) -> Any: ...

    def close(self) -> None: ...


def engine_maker(spec: BuildSpec) -> EngineMaker:
    """The spec's backend; each is imported only when asked for (torch is not installed where
    ONNX Runtime builds, and the other way round; TensorRT's builder only in NVIDIA's image)."""
    if spec.backend == "tensorrt":
        from .tensorrt import TensorRTMaker

        return TensorRTMaker(spec)
    if spec.backend == "torch":
        from .aoti import TorchAOTIMaker

        return TorchAOTIMaker(spec)
    from .onnxrt import OnnxRuntimeMaker

    return OnnxRuntimeMaker(spec)


def build(
    spec: BuildSpec,
    work_dir: Path,
    *,
    clock: Clock = CLOCK,
    timestamp: Callable[[], str] = utc_timestamp,
    progress: Callable[[str], None] = lambda _line: None,
) -> BuildReport:
    """Make, gate and publish every precision of ``spec``; engines whose build key matches an
    existing manifest are reused, not rebuilt. Returns what was published and what refused
    (:meth:`BuildReport.raise_for_refusal` turns a refusal into an error). ``progress`` gets a
    line as each phase ends (inputs fetched; per precision: built, gated, published)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    store = EngineStore(str(work_dir / "inputs"), spec.s3)
    source = _fetch(store, spec.source.uri, spec.source.sha256, "source")
    validation_file = _fetch(store, spec.validation.uri, spec.validation.sha256, "validation")
    calibration_file = (
        _fetch(store, spec.calibration.uri, spec.calibration.sha256, "calibration")
        if spec.calibration is not None and "int8" in spec.precisions
        else None
    )
    digests = {
        "source": sha256_file(source),
        "validation": sha256_file(validation_file),
        "calibration": sha256_file(calibration_file) if calibration_file else None,
    }
    progress("fetched: inputs")
    maker = engine_maker(spec)
    try:
        libraries = maker.libraries()
        destination = Destination.open(spec.output, spec.s3)
        # The reference: the source as written, FP32.
        reference = maker.reference(source, validation_file)
        artifacts = []
        for precision in spec.precisions:
            artifacts.append(
                _build_one(
                    spec,
                    precision,
                    maker,
                    reference,
                    destination,
                    work_dir,
                    digests,
                    libraries,
                    calibration_file,
                    clock,
                    timestamp,
                    progress,
                )
            )
    finally:
        maker.close()
    return BuildReport(tuple(artifacts))


def _reusable(
    destination: Destination,
    spec: BuildSpec,
    precision: str,
    prefix: str,
    file_name: str,
    key: str,
    key_material: dict[str, Any],
) -> Artifact | None:
    """The artifact already at ``prefix`` under the same build key (its engine intact), else
    None; ``ArtifactConflict`` where a published one was built from other inputs."""
    previous = destination.read(f"{prefix}/{MANIFEST}")
    if previous is None:
        return None
    old = Manifest.model_validate_json(previous)
    intact = not old.published or destination.size(f"{prefix}/{file_name}") == old.file.size_bytes
    if old.build_key == key and intact:
        return Artifact.at(destination, prefix, file_name, old, reused=True)
    if old.published and old.build_key != key:
        changed = ", ".join(differences(old.inputs, key_material))
        raise ArtifactConflict(
            f"{destination.uri(prefix)} already holds a published {precision} engine of "
            f"{spec.model}/{spec.version} built from other inputs (changed: {changed}); "
            "a published engine may be serving: build a new version instead"
        )
    return None


def _make_and_measure(
    maker: EngineMaker,
    reference: Reference,
    precision: str,
    engine: Path,
    calibration_file: Path | None,
    progress: Callable[[str], None],
) -> tuple[int | None, Path, AccuracyMetrics]:
    """Build ``engine`` and measure it against the reference: (calibration samples used, the
    file judged, its metrics); a model refused before building is judged instead."""
    try:
        used = maker.make(precision, engine, calibration_file)
    except RefusedBeforeBuild as early:  # the model it would be built from was refused
        progress(f"refused before building: {precision} ({early.judged.name})")
        return early.used, early.judged, early.metrics
    progress(f"built: {precision}")
    actual = maker.evaluate(engine, precision)
    return used, engine, measure(reference.expected, actual, reference.labels)


@dataclass(frozen=True)
class _Record:
    """What one precision's manifest records besides its verdict."""

    spec: BuildSpec
    precision: str
    key: str
    key_material: dict[str, Any]
    libraries: dict[str, str]
    digests: dict[str, str | None]
    reference: Reference
    judged: Path  # the file the gate judged (the engine, or the model refused before building)
    used: int | None  # calibration samples used

    def manifest(
        self,
        metrics: AccuracyMetrics,
        verdict: GateVerdict,
        timestamp: Callable[[], str],
        seconds: Callable[[], float],
    ) -> Manifest:
        spec, digests = self.spec, self.digests
        calibration = None
        if self.used is not None:
            assert spec.calibration is not None
            calibration = DataRecord(
                uri=spec.calibration.uri, sha256=digests["calibration"] or "", samples=self.used
            )
        file = file_record(self.judged)
        return Manifest(
            model=spec.model,
            version=spec.version,
            backend=spec.backend,
            target=spec.target,
            precision=self.precision,
            file=file,
            source=DataRecord(uri=spec.source.uri, sha256=digests["source"] or ""),
            calibration=calibration,
            validation=DataRecord(
                uri=spec.validation.uri,
                sha256=digests["validation"] or "",
                samples=self.reference.samples,
            ),
            profiles=list(spec.profiles),
            builder={"name": "tidal.runtime.builder", "version": self.key_material["builder"]},
            libraries=self.libraries,
            build_key=self.key,
            inputs=self.key_material,
            accuracy=accuracy_record(self.reference.output, metrics, spec.gate, verdict),
            published=verdict.passed,
            built_at=timestamp(),
            build_seconds=round(seconds(), 3),
        )


def _build_one(
    spec: BuildSpec,
    precision: str,
    maker: EngineMaker,
    reference: Reference,
    destination: Destination,
    work_dir: Path,
    digests: dict[str, str | None],
    libraries: dict[str, str],
    calibration_file: Path | None,
    clock: Clock,
    timestamp: Callable[[], str],
    progress: Callable[[str], None],
) -> Artifact:
    """One precision: reused when its manifest has the same key, else made, gated, published."""
    key_material = key_inputs(
        spec,
        precision,
        source_sha256=digests["source"] or "",
        calibration_sha256=digests["calibration"],
        validation_sha256=digests["validation"] or "",
        libraries=libraries,
    )
    key = build_key(key_material)
    prefix = artifact_prefix(spec, precision)
    file_name = engine_file_name(spec, precision, libraries)
    reused = _reusable(destination, spec, precision, prefix, file_name, key, key_material)
    if reused is not None:
        progress(f"reused: {precision}")
        return reused
    started = clock.monotonic()
    engine = work_dir / precision / file_name
    engine.parent.mkdir(parents=True, exist_ok=True)
    used, judged, metrics = _make_and_measure(
        maker, reference, precision, engine, calibration_file, progress
    )
    verdict = judge(metrics, spec.gate)
    progress(f"gated: {precision} {'passed' if verdict.passed else 'refused'}")
    record = _Record(
        spec, precision, key, key_material, libraries, digests, reference, judged, used
    )
    manifest = record.manifest(metrics, verdict, timestamp, lambda: clock.monotonic() - started)
    if verdict.passed and judged == engine:
        destination.put(f"{prefix}/{file_name}", engine)
    # Last: a manifest is the commit mark of an engine (and the record of a refusal).
    destination.put(f"{prefix}/{MANIFEST}", manifest.to_json().encode())
    progress(f"{'published' if verdict.passed else 'recorded refusal'}: {precision}")
    return Artifact.at(destination, prefix, file_name, manifest, reused=False)

"""``python -m tidal.runtime.builder SPEC [--work-dir DIR] [--report FILE]``: run one build.

Prints one line per engine (published or refused, built or reused, with the gate's numbers).
Exit status: 0 every engine published; 1 the accuracy gate refused one (nothing refused is
published); 2 the spec, the model, a data set or the store is wrong (the message names the
field); 3 a published engine of this version was built from other inputs.

``--spec-json TEXT`` takes the spec inline (how the operator's Jobs hand it over, with no
ConfigMap to mount). ``--report FILE`` writes the outcome as compact JSON (:func:`report_json`)
once every engine has a verdict (exit 0 or 1); a Job points it at its container's
``terminationMessagePath``, so the operator reads each engine's verdict from the pod's status
(at most 4096 bytes: reasons are shortened to fit). Nothing is written on exit 2 or 3, so the
kubelet falls back to the log's tail (``FallbackToLogsOnError``), which names the field.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from .build import ArtifactConflict, BuildReport, build
from .spec import BuildError, parse_build_spec, read_build_spec

REPORT_SCHEMA = "tidal.dev/build-report/v1"
# The kubelet keeps at most 4096 bytes of a termination message.
REPORT_MAX_BYTES = 4096


def report_json(report: BuildReport, limit: int = REPORT_MAX_BYTES) -> str:
    """The build's outcome as one JSON object, shortened to ``limit`` bytes: per engine its
    precision, verdict, engine and manifest URIs, sha256, build key and the gate's reason."""

    def render(reason_chars: int) -> str:
        engines = [
            {
                "precision": a.precision,
                "published": a.published,
                "reused": a.reused,
                "uri": a.engine_uri,
                "manifest": a.manifest_uri,
                "sha256": a.manifest.file.sha256 if a.published else None,
                "buildKey": a.manifest.build_key,
                "top1Agreement": a.manifest.accuracy.top1_agreement,
                "reason": a.manifest.accuracy.reason[:reason_chars],
            }
            for a in report.artifacts
        ]
        return json.dumps({"schema": REPORT_SCHEMA, "engines": engines}, separators=(",", ":"))

    for reason_chars in (400, 160, 60, 0):
        text = render(reason_chars)
        if len(text.encode()) <= limit:
            return text
    raise ValueError(f"a report of {len(report.artifacts)} engines does not fit {limit} bytes")


def _progress(line: str) -> None:
    """A phase's end on stderr with its wall time to the millisecond (the journey's table in
    e2e/test_build_journey.py reads these from the build pod's log)."""
    from ...common.clock import utc_timestamp

    print(f"{utc_timestamp(timespec='milliseconds')} {line}", file=sys.stderr)
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidal.runtime.builder", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("spec", nargs="?", help="the build spec, YAML or JSON (runtime/BUILD.md)")
    source.add_argument("--spec-json", help="the build spec inline, as JSON")
    parser.add_argument(
        "--work-dir", help="where inputs are fetched and engines made; default: a temp dir"
    )
    parser.add_argument("--report", help="write the outcome here as JSON (exit 0 or 1 only)")
    args = parser.parse_args(argv)
    try:
        if args.spec_json is not None:
            try:
                data = json.loads(args.spec_json)
            except ValueError as exc:
                print(f"error: --spec-json is not valid JSON: {exc}", file=sys.stderr)
                return 2
            spec = parse_build_spec(data)
        else:
            spec = read_build_spec(args.spec)
        work = Path(args.work_dir or tempfile.mkdtemp(prefix="tidal-build-"))
        report = build(spec, work, progress=_progress)
    except ArtifactConflict as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for artifact in report.artifacts:
        print(artifact.describe())
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(report_json(report))
    if report.refused:
        print(
            f"error: the accuracy gate refused {len(report.refused)} of "
            f"{len(report.artifacts)} engines; they were not published",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

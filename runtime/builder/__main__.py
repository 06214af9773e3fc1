"""``python -m tidal.runtime.builder SPEC [--work-dir DIR]``: run one build.

Prints one line per engine (published or refused, built or reused, with the gate's numbers).
Exit status: 0 every engine published; 1 the accuracy gate refused one (nothing refused is
published); 2 the spec, the model, a data set or the store is wrong (the message names the
field); 3 a published engine of this version was built from other inputs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tidal.runtime.builder.build import ArtifactConflict, build
from tidal.runtime.builder.spec import BuildError, read_build_spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tidal.runtime.builder", description=__doc__)
    parser.add_argument("spec", help="the build spec, YAML or JSON (runtime/BUILD.md)")
    parser.add_argument(
        "--work-dir", help="where inputs are fetched and engines made; default: a temp dir"
    )
    args = parser.parse_args(argv)
    try:
        spec = read_build_spec(args.spec)
        work = Path(args.work_dir or tempfile.mkdtemp(prefix="tidal-build-"))
        report = build(spec, work)
    except ArtifactConflict as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for artifact in report.artifacts:
        print(artifact.describe())
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

#!/usr/bin/env bash
# Regenerates oip_v2_pb2.py/.pyi from oip_v2.proto (run from anywhere; needs network for pip).
# The gencode must not be newer than the oldest protobuf runtime pyproject allows
# (protobuf>=6.31): grpcio-tools 1.76 emits 6.31.1 gencode.  The generated files are
# committed, formatted, and told apart from hand-written code for ruff and mypy.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tools="${TMPDIR:-/tmp}/tidal-grpc-tools"
[ -x "$tools/bin/python" ] || {
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q "grpcio-tools==1.76.0"
}
cd "$here"
"$tools/bin/python" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. oip_v2.proto
for f in oip_v2_pb2.py oip_v2_pb2.pyi; do
  { echo "# ruff: noqa"; echo "# mypy: ignore-errors"; cat "$f"; } > "$f.tmp" && mv "$f.tmp" "$f"
done
"$root/.venv/bin/ruff" format -q oip_v2_pb2.py oip_v2_pb2.pyi

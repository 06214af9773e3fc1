#!/usr/bin/env bash
# The S3 fetch bench (bench/s3_fetch_bench.py) on a quiet machine that has python3 but neither
# the project's packages nor the sandbox's binaries, nor a network: one reproducible command.
#
#   bash bench/s3_device_run.sh [DIR]
#
# DIR (default .whl) holds what travels with the repository (the device tool sends the session's
# own checkout: put DIR inside it, git-ignored, and name it in carry; the 2026-12-06 run used .whl/s3dev):
#   *.whl           wheels for that machine's python3 (pydantic, pydantic_core, annotated-types,
#                   typing_extensions, typing-inspection, pydantic-settings, python-dotenv,
#                   obstore, pyyaml, cryptography, cffi, pycparser), made here with
#                   pip download --no-deps --only-binary=:all: --python-version 3.12 ...
#   versitygw.xz    the sandbox's object store, xz of ~/.cache/tidal/versitygw-v1.8.0/bin/versitygw
# It installs the wheels into /tmp/site, puts versitygw where tidal.sandbox.binaries looks
# (TIDAL_CACHE, with empty stand-ins for the cluster binaries the bench never starts, so that
# ensure_binaries does not try to build them), runs the bench at 512 MiB and 1 GiB from the
# repository root, and writes everything printed to $OUT/s3_fetch-device.txt ($OUT defaults to
# ./out). SIZES changes the runs: MiB:repetitions pairs (default "512:9 1024:7").
set -uo pipefail
DIR=${1:-.whl}
OUT=${OUT:-out}
mkdir -p "$OUT"
LOG="$OUT/s3_fetch-device.txt"
export PYTHONUNBUFFERED=1
{
  echo "== machine"
  date -u
  echo "cores: $(nproc)"
  grep -m1 'model name' /proc/cpuinfo
  free -g | head -2
  uptime
  df -h "${TMPDIR:-/tmp}" | tail -1
  python3 -V
  nvidia-smi -L 2>/dev/null || true
} 2>&1 | tee "$LOG"

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "${SITE:=/tmp/site}" "$DIR"/*.whl || exit 1
export PYTHONPATH="$SITE":.

export TIDAL_CACHE=${TIDAL_CACHE_DIR:-/tmp/tidal-cache}
bin="$TIDAL_CACHE/versitygw-v1.8.0/bin"
mkdir -p "$bin"
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
  "$DIR/versitygw.xz" "$bin/versitygw" || exit 1
chmod +x "$bin/versitygw"
for stub in etcd-v3.6.16/bin/etcd k8s-v1.37.2/bin/kube-apiserver \
  k8s-v1.37.2/bin/kube-controller-manager k8s-v1.37.2/bin/kube-scheduler \
  k8s-v1.37.2/bin/kubectl prometheus/usr/bin/prometheus; do
  mkdir -p "$(dirname "$TIDAL_CACHE/$stub")"
  printf '#!/bin/sh\nexit 1\n' >"$TIDAL_CACHE/$stub"
  chmod +x "$TIDAL_CACHE/$stub"
done
sha256sum "$bin/versitygw" | tee -a "$LOG"
python3 -c 'import obstore, pydantic; print("obstore", obstore.__version__, "pydantic", pydantic.VERSION)' \
  2>&1 | tee -a "$LOG"

status=0
for run in ${SIZES:-512:9 1024:7}; do
  set -- ${run/:/ }
  echo "== python3 bench/s3_fetch_bench.py --mib $1 --repeat $2" | tee -a "$LOG"
  python3 bench/s3_fetch_bench.py --mib "$1" --repeat "$2" 2>&1 | tee -a "$LOG" || status=1
  uptime | tee -a "$LOG"
done
exit $status

#!/usr/bin/env bash
# The whole GPU run in one device call: setup facts, both packages built, bench/gpu_bench.py run,
# make gpu-test.  Each step is its own process (python -X faulthandler: a crash prints its
# stack), its own log under $OUT, every line time-stamped; one step failing does not stop the
# next.  A step past its time gets SIGUSR1 first (gpu_bench.py dumps every thread's stack on it),
# then SIGKILL 10 s later.  The whole script keeps inside DEADLINE_S seconds (default 540).
#   run from the repository root on the device machine:  bash bench/gpu_device_run.sh
# Wheels carried in .whl/ (pydantic and its needs, absent from the device image) are installed
# into /tmp/site first.
set -u
OUT=${OUT:-/tmp/gpu-out}
PKG=${PKG:-/tmp/tidal-pt2}
DEADLINE_S=${DEADLINE_S:-540}
mkdir -p "$OUT" "$PKG"
export PYTHONUNBUFFERED=1
# One compile thread: no inductor worker pool in the build processes (one moving part fewer;
# these models have a handful of kernels).
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-1}
T0=$(date +%s)
stamp() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*"; }
# limited SECONDS CMD...: CMD under min(SECONDS, time left), USR1 then KILL; prints its rc.
limited() {
  local want=$1 left
  shift
  left=$((DEADLINE_S - ($(date +%s) - T0) - 15))
  if ((left < 10)); then
    stamp "SKIPPED (time): $*"
    return 124
  fi
  ((want > left)) && want=$left
  stamp "start (limit ${want}s): $*"
  timeout -s USR1 -k 10 "$want" "$@"
  local rc=$?
  stamp "rc=$rc: $*"
  return $rc
}

{
  stamp setup
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && stamp "wheels installed: $(ls .whl | tr '\n' ' ')"
  fi
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.max.sm --format=csv
  echo "cores $(nproc); $(grep MemTotal /proc/meminfo); $(uname -r)"
  PYTHONPATH=/tmp/site python3 -c 'import sys, torch, pydantic, numpy
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(), torch.cuda.get_device_capability(),
      "pydantic", pydantic.VERSION, "numpy", numpy.__version__)'
  stamp "setup done"
} >"$OUT/setup.txt" 2>&1
export PYTHONPATH=/tmp/site

{
  for model in mlp big; do
    limited 170 python3 -X faulthandler bench/gpu_bench.py build --model "$model" "$PKG"
    if [ ! -f "$PKG/$model.path" ]; then
      limited 60 python3 -X faulthandler bench/gpu_bench.py finish --model "$model" "$PKG"
    fi
  done
  ls -laR "$PKG"
} >"$OUT/build.txt" 2>&1

limited 170 python3 -X faulthandler bench/gpu_bench.py run "$PKG" >"$OUT/gpu_bench.txt" 2>&1

# -o timeout: pytest-timeout (on the image) dumps the stacks of a test that hangs.
TIDAL_GPU_PACKAGES=$PKG limited 170 make gpu-test \
  PYTEST="python3 -X faulthandler -m pytest -v -o timeout=100" >"$OUT/gpu_test.txt" 2>&1

stamp "all steps done" | tee -a "$OUT/gpu_test.txt"

#!/usr/bin/env bash
# The whole GPU run in one device call: setup facts (the C++ compiler's too); the packages built
# under each inductor configuration in OVERRIDES below at once (now only "std", torch_aoti's
# PACKAGE_INDUCTOR_CONFIGS; 2026-12-04b compared several this way); each candidate's mlp
# package loaded and run once on the main thread (bench/gpu_bench.py diag, each its own
# process); bench/gpu_bench.py run and make gpu-test on the packages of the first candidate
# that ran; cuda-gdb's native stack of a crashing load where none ran.  Each step is
# its own process (python -X faulthandler: a crash prints its Python stack), its own log under
# $OUT, every line time-stamped; one step failing does not stop the next.  A step past its time
# gets SIGUSR1 first (gpu_bench.py dumps every thread's stack on it), then SIGKILL 10 s later.
# The whole script keeps inside DEADLINE_S seconds (default 560).
#   run from the repository root on the device machine:  bash bench/gpu_device_run.sh
# Wheels carried in .whl/ (pydantic and its needs, absent from the device image) are installed
# into /tmp/site first.
set -u
ulimit -c 0 # no core files: a crashing load otherwise took ~50 s to end (2026-12-04b)
OUT=${OUT:-/tmp/gpu-out}
DEADLINE_S=${DEADLINE_S:-560}
mkdir -p "$OUT"
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
  echo "cores $(nproc); $(grep MemTotal /proc/meminfo); $(uname -r); ulimit -s $(ulimit -s)"
  echo "cuda-gdb: $(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)"
  echo "CXX=${CXX:-} CXXFLAGS=${CXXFLAGS:-} LDFLAGS=${LDFLAGS:-}"
  echo "g++: $(command -v g++) -> $(readlink -f "$(command -v g++)")"
  g++ --version | head -1
  echo "g++ specs lines naming static: $(g++ -dumpspecs | grep -c static)"
  for cxx in g++ "${CXX:-}"; do
    [ -n "$cxx" ] || continue
    echo "$cxx: $(file -L "$(command -v "$cxx")" | cut -c1-160)"
    echo "  -print-file-name=libstdc++.so: $("$cxx" -print-file-name=libstdc++.so)"
    echo "  -print-file-name=libstdc++.a: $("$cxx" -print-file-name=libstdc++.a)"
    "$cxx" -v 2>&1 | tail -2 | cut -c1-300
  done
  if [ -n "${CXX:-}" ] && [ "$(head -c 2 "$CXX")" = "#!" ]; then head -20 "$CXX"; fi
  ls -la /opt/gcc/bin 2>&1 | head -8
  python3 -c 'import torch
print("libstdc++ mapped after import torch:",
      sorted({l.split()[-1] for l in open("/proc/self/maps") if "libstdc++" in l}))'
  PYTHONPATH=/tmp/site python3 -c 'import sys, torch, pydantic, numpy
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(), torch.cuda.get_device_capability(),
      "pydantic", pydantic.VERSION, "numpy", numpy.__version__)'
  stamp "setup done"
} >"$OUT/setup.txt" 2>&1
export PYTHONPATH=/tmp/site

# Candidate inductor configurations (gpu_bench.py build --inductor-config KEY=JSON overrides of
# PACKAGE_INDUCTOR_CONFIGS; 2026-12-04b tried several): "std" is the configuration as committed.
declare -A OVERRIDES=(
  [std]=""
)
ORDER="std"
BUILDS=(std:mlp std:big)
BUILD_PIDS=()
for b in "${BUILDS[@]}"; do
  c=${b%%:*} m=${b##*:}
  mkdir -p "/tmp/pkg-$c"
  # shellcheck disable=SC2086
  limited 240 python3 -X faulthandler bench/gpu_bench.py build --model "$m" ${OVERRIDES[$c]} \
    "/tmp/pkg-$c" >"/tmp/build-$c-$m.log" 2>&1 &
  BUILD_PIDS+=($!)
done
wait "${BUILD_PIDS[@]}"
{
  for b in "${BUILDS[@]}"; do
    echo "=== build ${b/:/ } (all ${#BUILDS[@]} in parallel)"
    grep -v "FutureWarning\|return cls.__new__" "/tmp/build-${b/:/-}.log"
  done
} >"$OUT/build.txt" 2>&1

# The loading and running steps need no CPU-ISA compile check (TorchAOTIBackend() spent 54 s
# on it on 2026-12-04, and so would every diag process): trust the CPU's flags.
export TORCHINDUCTOR_VEC_ISA_OK=1
DIAGS=(std:main)
DIAG_PIDS=()
for d in "${DIAGS[@]}"; do
  c=${d%%:*} v=${d##*:}
  (
    limited 80 python3 -X faulthandler bench/gpu_bench.py diag --variant "$v" "/tmp/pkg-$c" \
      >"/tmp/diag-$c-$v.log" 2>&1
    echo $? >"/tmp/diag-$c-$v.rc"
  ) &
  DIAG_PIDS+=($!)
done
wait "${DIAG_PIDS[@]}"
{
  for d in "${DIAGS[@]}"; do
    echo "=== diag ${d/:/ }: rc $(cat "/tmp/diag-${d/:/-}.rc")"
    grep -v "FutureWarning\|return cls.__new__\|^Extension modules" "/tmp/diag-${d/:/-}.log"
  done
} >"$OUT/diag.txt" 2>&1

chosen=""
for c in $ORDER; do
  if [ "$(cat "/tmp/diag-$c-main.rc")" = 0 ]; then chosen=$c && break; fi
done
stamp "first candidate whose mlp package ran: ${chosen:-none}" | tee -a "$OUT/diag.txt"
if [ -n "$chosen" ]; then
  PKG=/tmp/pkg-$chosen
  if [ ! -f "$PKG/big.path" ]; then
    # shellcheck disable=SC2086
    limited 200 python3 -X faulthandler bench/gpu_bench.py build --model big \
      ${OVERRIDES[$chosen]} "$PKG" >>"$OUT/build.txt" 2>&1
  fi
  limited 170 python3 -X faulthandler bench/gpu_bench.py run "$PKG" >"$OUT/gpu_bench.txt" 2>&1
  # -o timeout: pytest-timeout (on the image) dumps the stacks of a test that hangs.
  TIDAL_GPU_PACKAGES=$PKG limited 170 make gpu-test \
    PYTEST="python3 -X faulthandler -m pytest -v -o timeout=100" >"$OUT/gpu_test.txt" 2>&1
else
  GDB=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
  limited 200 "$GDB" -q -batch -ex "set pagination off" -ex "set print thread-events off" \
    -ex "handle SIGUSR1 SIGPIPE nostop noprint pass" -ex run -ex bt 40 \
    --args python3 bench/gpu_bench.py diag --variant main /tmp/pkg-std >"$OUT/gdb.txt" 2>&1
fi
stamp "all steps done" | tee -a "$OUT/diag.txt"

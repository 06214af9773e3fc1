#!/usr/bin/env bash
# The whole GPU run in one device call (issue 34): setup facts; the mlp and big packages built
# at once; meanwhile, what a backend's start paid before issue 34 (importing torch._inductor and
# inductor's CPU-ISA probe: bench/gpu_start.py phases --mode before, no package loads yet) and
# `python -X importtime` of torch; then, each its own process, one after the other: the start
# phase by phase as it is now (gpu_start.py phases), the runtime CLI's time to ready
# (gpu_start.py server), bench/gpu_bench.py run (throughput with and without CUDA graphs, cold
# load, churn with and without concurrency and the allocator cap), bench/gpu_coldstart.py
# (N = 1, 2, 4 processes cold-loading 1 GiB at once beside a serving neighbour, without and with
# the node load gate), make gpu-test, and last, when $OLD_TREE names a checkout of the code
# before issue 34, that checkout's own bench/gpu_bench.py run on the same packages (the
# "before" throughput and churn on the same card).  Every line time-stamped, each step's output
# in its own file under $OUT; one step failing does not stop the next.  A step past its time
# gets SIGUSR1 first (gpu_bench.py dumps every thread's stack on it), then SIGKILL 10 s later.
# The whole script keeps inside DEADLINE_S seconds (default 560).
#   run from the repository root on the device machine:  bash bench/gpu_device_run.sh
# MODE=torch-build runs the torch builder's steps instead (issue 32 item 5; see below);
# MODE=weights issue 46's (engine bytes to the GPU, weight streaming; see below).
# Wheels carried in .whl/ (bench/gpu_wheels.sh: pydantic, pydantic-settings and their needs,
# absent from the device image; obstore for the builder's S3 store; runai-model-streamer 0.17.1
# and fastsafetensors 0.5.0 for MODE=weights) are installed into /tmp/site first.
set -u
ulimit -c 0 # no core files: a crashing load otherwise took ~50 s to end (2026-12-04b)
OUT=${OUT:-/tmp/gpu-out}
DEADLINE_S=${DEADLINE_S:-560}
OLD_TREE=${OLD_TREE:-}
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
  echo "cores $(nproc); $(grep MemTotal /proc/meminfo); $(uname -r)"
  echo "CXX=${CXX:-}; OLD_TREE=${OLD_TREE:-none} ($(cat "${OLD_TREE:-/nonexistent}/.commit" 2>/dev/null))"
  PYTHONPATH=/tmp/site python3 -c 'import sys, torch, pydantic, numpy
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name(), torch.cuda.get_device_capability(),
      "pydantic", pydantic.VERSION, "numpy", numpy.__version__)'
  stamp "setup done"
} >"$OUT/setup.txt" 2>&1
export PYTHONPATH=/tmp/site
# Every step below as the device script of 2026-12-04 ran them (the H100 run of 2026-12-06 too).
export TORCHINDUCTOR_VEC_ISA_OK=1
PKG=/tmp/pkg
BUILD_PIDS=()
# start_package_builds SECONDS: bench/gpu_bench.py's mlp and big packages (what make gpu-test
# loads), each built by its own process in the background; their pids go to BUILD_PIDS.
start_package_builds() {
  for m in mlp big; do
    limited "$1" python3 -X faulthandler bench/gpu_bench.py build --model "$m" "$PKG" \
      >"/tmp/build-$m.log" 2>&1 &
    BUILD_PIDS+=($!)
  done
}

# MODE=torch-build (issue 32 item 5): the torch builder on this GPU instead of the steps below.
# The sources (bench/torch_build_bench.py sources), then at once, each its own process: one
# build per (model, precision) through the builder's command, and bench/gpu_bench.py's mlp and
# big packages for make gpu-test; then every precision of each model again in one spec (same
# build keys: all reused), the throughput of what was published (torch_build_bench.py run),
# and make gpu-test (tests/gpu, the builder's tests on these builds among them).
if [ "${MODE:-}" = torch-build ]; then
  TB=/tmp/tb
  mkdir -p "$TB" "$PKG"
  limited 120 python3 -X faulthandler bench/torch_build_bench.py sources "$TB" >"$OUT/build.txt" 2>&1
  start_package_builds 300
  for m in small wide; do
    for p in fp32 fp16 bf16; do
      limited 330 python3 -X faulthandler -m tidal.runtime.builder "$TB/$m/spec-$p.json" \
        --work-dir "/tmp/work-$m-$p" >"/tmp/tb-$m-$p.log" 2>&1 &
      BUILD_PIDS+=($!)
    done
  done
  wait "${BUILD_PIDS[@]}"
  {
    for f in /tmp/tb-*.log /tmp/build-*.log; do
      echo "=== $f"
      grep -v "FutureWarning\|return cls.__new__\|torch.frombuffer\|not writable" "$f"
    done
    echo "=== every precision of each model in one spec: the same build keys, nothing rebuilt"
    for m in small wide; do
      limited 120 python3 -m tidal.runtime.builder "$TB/$m/spec.json" --work-dir "/tmp/work-$m" \
        2>&1 | grep -v "FutureWarning\|return cls.__new__\|torch.frombuffer\|not writable"
    done
  } >>"$OUT/build.txt" 2>&1
  (cd "$TB/published" && find . -name manifest.json | sort | xargs tail -n +1) >"$OUT/manifests.txt"
  limited 200 python3 -X faulthandler bench/torch_build_bench.py run "$TB" \
    >"$OUT/torch_build_bench.txt" 2>&1
  TIDAL_GPU_PACKAGES=$PKG TIDAL_TORCH_BUILDS=$TB limited 200 make gpu-test \
    PYTEST="python3 -X faulthandler -m pytest -v -o timeout=150" >"$OUT/gpu_test.txt" 2>&1
  stamp "all steps done" | tee -a "$OUT/setup.txt"
  exit 0
fi

# MODE=weights (issue 46): engine bytes to the GPU and weight streaming, against their peers.
# Facts (which peer loaders import, the disk's rate), bench/gpu_weights_bench.py stage (a
# GIB_STAGE GiB safetensors file hot and dropped from the page cache: dd, tidal's staging with
# and without verification, safetensors, Run:ai Model Streamer, fastsafetensors), stream (the
# resident fraction 100/75/50/25 % at batch 1/8/64 against accelerate's cpu_offload) and pair
# (two streaming processes on the GPU at once against one alone; the cold first pass), after
# the GPU tests of both (tests/gpu/test_weights_gpu.py).  Nothing else: these steps fill a call.
# The wheels: bash bench/gpu_wheels.sh (here, before the call; .whl/ is git-ignored: carry it).
if [ "${MODE:-}" = weights ]; then
  W=/tmp/weights
  limited 60 python3 bench/gpu_weights_bench.py facts "$W" >"$OUT/facts.txt" 2>&1
  limited 120 python3 -X faulthandler -m pytest -p no:cacheprovider --confcutdir=tests/gpu \
    -m gpu -v -o timeout=100 tests/gpu/test_weights_gpu.py >"$OUT/gpu_test.txt" 2>&1
  limited 260 python3 -X faulthandler bench/gpu_weights_bench.py stage "$W" \
    --gib "${GIB_STAGE:-10}" >"$OUT/stage.txt" 2>&1
  limited 200 python3 -X faulthandler bench/gpu_weights_bench.py stream \
    >"$OUT/stream.txt" 2>&1
  limited 120 python3 -X faulthandler bench/gpu_weights_bench.py pair >"$OUT/pair.txt" 2>&1
  stamp "all steps done" | tee -a "$OUT/setup.txt"
  exit 0
fi

mkdir -p "$PKG"
start_package_builds 240
{
  echo "=== while the packages build (2 compiler processes of 16 cores busy):"
  echo "=== 1. what the start paid before issue 34 (torch._inductor, inductor's CPU-ISA probe), no loads"
  TIDAL_T0_NS=$(date +%s%N) limited 150 python3 bench/gpu_start.py phases --mode before /tmp/none
  echo "=== 2. python -X importtime -c 'import torch, torch._inductor': the 15 slowest (cumulative us)"
  python3 -X importtime -c 'import torch, torch._inductor' 2>/tmp/importtime.txt
  sort -t'|' -k2 -n -r /tmp/importtime.txt | head -15
} >"$OUT/start.txt" 2>&1
wait "${BUILD_PIDS[@]}"
{
  for m in mlp big; do
    echo "=== build $m"
    grep -v "FutureWarning\|return cls.__new__" "/tmp/build-$m.log"
  done
} >"$OUT/build.txt" 2>&1

if [ -f "$PKG/mlp.path" ] && [ -f "$PKG/big.path" ]; then
  {
    echo "=== 3. the start now, phase by phase (fresh process, packages loaded)"
    TIDAL_T0_NS=$(date +%s%N) limited 90 python3 -X faulthandler bench/gpu_start.py phases \
      --mode after "$PKG"
    echo "=== 4. the runtime CLI (python -m tidal.runtime, backend torch, mlp preloaded) to ready"
    limited 90 python3 bench/gpu_start.py server "$PKG"
  } >>"$OUT/start.txt" 2>&1
  limited 170 python3 -X faulthandler bench/gpu_bench.py run "$PKG" >"$OUT/gpu_bench.txt" 2>&1
  limited 150 python3 bench/gpu_coldstart.py run "$PKG" >"$OUT/coldstart.txt" 2>&1
  # -o timeout: pytest-timeout (on the image) dumps the stacks of a test that hangs.
  TIDAL_GPU_PACKAGES=$PKG limited 170 make gpu-test \
    PYTEST="python3 -X faulthandler -m pytest -v -o timeout=120" >"$OUT/gpu_test.txt" 2>&1
  if [ -n "$OLD_TREE" ] && [ -f "$OLD_TREE/bench/gpu_bench.py" ]; then
    (cd "$OLD_TREE" && limited 120 python3 -X faulthandler bench/gpu_bench.py run "$PKG") \
      >"$OUT/old_bench.txt" 2>&1
  fi
else
  stamp "a package did not build: see build.txt" | tee -a "$OUT/build.txt"
fi
stamp "all steps done" | tee -a "$OUT/setup.txt"

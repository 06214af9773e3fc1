#!/usr/bin/env bash
# The wheels bench/gpu_device_run.sh installs on the GPU machine (its image has torch, numpy,
# safetensors, accelerate, humanize and typer, not these): pydantic, pydantic-settings and their
# needs (the runtime and its settings loader),
# obstore (the builder's S3 store, which tests/gpu/test_torch_builder_gpu.py imports) and the
# peer loaders of issue 46 (runai-model-streamer, fastsafetensors).  Into .whl/ (git-ignored);
# the device call carries it.  Versions: pydantic's from uv.lock, the peers' from issue 46.
set -eu
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  pydantic-settings==2.16.3 python-dotenv==1.2.4 \
  obstore==0.12.1 runai-model-streamer==0.17.1 fastsafetensors==0.5.0
ls .whl

# syntax=docker/dockerfile:1
# The tidal runtime: `tidal-runtime` (Open Inference Protocol v2 server) on NVIDIA's TensorRT
# image, which brings CUDA, TensorRT and its Python bindings; ONNX Runtime (CPU) comes with
# the project for the onnxruntime backend. It also runs TensorRT ModelBuild Jobs.
#
# Build from the repository root (the context must be the repository):
#   docker build -f images/runtime.Dockerfile -t ghcr.io/tidal-serving/tidal-runtime:0.1.0 .
# (names and version: common/release.py, checked by tests/charts/test_release_names.py).
# TensorRT plans only load on the TensorRT version that built them (unless built version-
# compatible): set TENSORRT_IMAGE to the release your plans were built with, e.g.
#   --build-arg TENSORRT_IMAGE=nvcr.io/nvidia/tensorrt:25.12-py3
# The release must be CUDA 13 based (cuda-python 13 is installed below).
ARG TENSORRT_IMAGE=nvcr.io/nvidia/tensorrt:25.12-py3
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# --- wheel: the project is pure Python, so any Python builds it -----------------------------
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tidal/ tidal/
COPY operator/ operator/
COPY runtime/ runtime/
COPY gateway/ gateway/
COPY common/ common/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- final: the TensorRT image plus the runtime ---------------------------------------------
FROM ${TENSORRT_IMAGE}
LABEL org.opencontainers.image.title="tidal-runtime" \
      org.opencontainers.image.description="tidal inference runtime (TensorRT, ONNX Runtime)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.source="https://github.com/tidal-serving/tidal" \
      org.opencontainers.image.licenses="Apache-2.0"
# The `builder` extra makes this the image of TensorRT ModelBuild Jobs too (`python -m
# tidal.runtime.builder`, runtime/BUILD.md): NVIDIA's image brings TensorRT's builder, which
# no package index these images are made from serves.
# The `gpu` extra is deliberately not installed: its TensorRT wheels would shadow the base
# image's `tensorrt` module with bindings that may not match the image's libnvinfer. Only
# cuda-python (the other half of the gpu extra) is added. PIP_BREAK_SYSTEM_PACKAGES: the
# image's Python is the system one (PEP 668); this image exists to run this one program.
COPY --from=wheel /wheels /tmp/wheels
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir \
      "$(echo /tmp/wheels/tidal-*.whl)[runtime,gateway,builder]" "cuda-python>=13,<14" \
 && rm -rf /tmp/wheels \
 && python3 -c "import tensorrt; print('TensorRT', tensorrt.__version__)" \
 && tidal-runtime --help > /dev/null \
 && tidal-gateway --help > /dev/null \
 && python3 -m tidal.runtime.builder --help > /dev/null \
 && python3 -c "import tidal.runtime.builder.tensorrt as t; t.import_builder()" \
 && useradd --uid 65532 --user-group --create-home --home-dir /home/tidal \
      --shell /usr/sbin/nologin tidal
ENV PYTHONUNBUFFERED=1 \
    TIDAL_HOST=0.0.0.0 \
    TIDAL_PORT=8080
WORKDIR /home/tidal
# Numeric, so `runAsNonRoot: true` can verify it. Downloaded engines go to a temp dir (or the
# runtime's cache_dir): mount a volume there for a cache that outlives the pod.
USER 65532:65532
EXPOSE 8080
# Runtime pods set `command: [tidal-runtime]` themselves, so NVIDIA's entrypoint script (banner,
# CUDA forward-compatibility setup) is bypassed there too: run hosts whose driver supports the
# image's CUDA release.
ENTRYPOINT ["tidal-runtime"]

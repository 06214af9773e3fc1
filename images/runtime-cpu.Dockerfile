# syntax=docker/dockerfile:1
# The tidal runtime for CPU nodes: `tidal-runtime` (Open Inference Protocol v2 server, ONNX Runtime
# backend) and `tidal-gateway` (a fleet's or a scaled-to-zero service's front door) on a slim
# Python, as a non-root user with a read-only root filesystem. GPU nodes use runtime.Dockerfile.
#
# Build from the repository root (the context must be the repository):
#   docker build -f images/runtime-cpu.Dockerfile -t ghcr.io/tidal-serving/tidal-runtime-cpu:0.1.0 .
# (names and version: common/release.py, checked by tests/charts/test_release_names.py).
# The sandbox builds it with buildah on a Debian base made by mmdebstrap (PYTHON_IMAGE).
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# --- build: the project and its dependencies into a virtualenv ------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the package is built from (tidal/ holds the links giving operator/, runtime/,
# gateway/ and common/ their import names; see pyproject.toml). The sandbox is not part of it.
COPY pyproject.toml ./
# The dependencies first, in a layer of their own: pyproject.toml's shared ones and the `runtime`,
# `gateway` and `builder` extras (no Kubernetes client; `builder` is onnx, for the ModelBuild Jobs
# that run `python -m tidal.runtime.builder` in this image), at the versions uv.lock pins,
# hash-checked (images/requirements/runtime-cpu.txt, exported by `make lock`); a change to the
# code or the README rebuilds only the last step.
COPY images/requirements/runtime-cpu.txt /tmp/requirements.txt
RUN python -m venv /opt/tidal \
 && /opt/tidal/bin/pip install --no-cache-dir --require-hashes -r /tmp/requirements.txt
COPY README.md ./
COPY tidal/ tidal/
COPY operator/ operator/
COPY runtime/ runtime/
COPY gateway/ gateway/
COPY common/ common/
# The operator's code and script go: its dependencies are not here.
RUN /opt/tidal/bin/pip install --no-cache-dir --no-deps . \
 && rm -rf /opt/tidal/bin/tidal-operator /opt/tidal/lib/python3*/site-packages/tidal/operator \
 && /opt/tidal/bin/tidal-runtime --help > /dev/null \
 && /opt/tidal/bin/tidal-gateway --help > /dev/null \
 && /opt/tidal/bin/python -m tidal.runtime.builder --help > /dev/null

# --- final: the virtualenv alone ------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tidal-runtime-cpu" \
      org.opencontainers.image.description="tidal inference runtime and gateway (ONNX Runtime, CPU)" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.source="https://github.com/tidal-serving/tidal" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/tidal /opt/tidal
# Bytecode was compiled at install time; never write .pyc into a read-only filesystem.
ENV PATH=/opt/tidal/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TIDAL_HOST=0.0.0.0 \
    TIDAL_PORT=8080
# Numeric, so `runAsNonRoot: true` can verify it. Engines are cached under /var/cache/tidal
# (the pod mounts a volume there: see spec.runtime.engineCache); nothing else is written.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["tidal-runtime"]

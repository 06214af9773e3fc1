# syntax=docker/dockerfile:1
# The tidal operator: `tidal-operator` (kopf) on a slim Python, as a non-root user.
#
# Build from the repository root (the context must be the repository):
#   docker build -f images/operator.Dockerfile -t ghcr.io/tidal-serving/tidal-operator:0.1.0 .
# (names and version: common/release.py, checked by tests/charts/test_release_names.py).
# The chart (charts/tidal) runs it with a read-only root filesystem: nothing here writes to it.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# --- build: the project and its dependencies into a virtualenv, from the repository ---------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the package is built from (tidal/ holds the links giving operator/, runtime/,
# gateway/ and common/ their import names; see pyproject.toml). The sandbox is not part of it.
COPY pyproject.toml ./
# The dependencies first, in a layer of their own: pyproject.toml's shared ones and the `operator`
# extra only (no inference stack), at the versions uv.lock pins, hash-checked
# (images/requirements/operator.txt, exported by `make lock`); a change to the code or the README
# rebuilds only the last step.
COPY images/requirements/operator.txt /tmp/requirements.txt
RUN python -m venv /opt/tidal \
 && /opt/tidal/bin/pip install --no-cache-dir --require-hashes -r /tmp/requirements.txt
COPY README.md ./
COPY tidal/ tidal/
COPY operator/ operator/
COPY runtime/ runtime/
COPY gateway/ gateway/
COPY common/ common/
# The runtime's and the gateway's code and scripts go: their dependencies are not here.
RUN /opt/tidal/bin/pip install --no-cache-dir --no-deps . \
 && rm -rf /opt/tidal/bin/tidal-runtime /opt/tidal/bin/tidal-gateway \
      /opt/tidal/lib/python3*/site-packages/tidal/runtime \
      /opt/tidal/lib/python3*/site-packages/tidal/gateway \
 && /opt/tidal/bin/tidal-operator --help > /dev/null

# --- final: the virtualenv alone ------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tidal-operator" \
      org.opencontainers.image.description="Kubernetes operator for elastic GPU inference" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.source="https://github.com/tidal-serving/tidal" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/tidal /opt/tidal
# Bytecode was compiled at install time; never write .pyc into a read-only filesystem.
ENV PATH=/opt/tidal/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# A numeric user, so `runAsNonRoot: true` can verify it without a passwd lookup.
USER 65532:65532
# Prometheus metrics (TIDAL_OPERATOR_METRICS_PORT) and /healthz (TIDAL_OPERATOR_HEALTH_PORT).
EXPOSE 8081 8082
ENTRYPOINT ["tidal-operator"]

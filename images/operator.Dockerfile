# syntax=docker/dockerfile:1
# The tidal operator: `tidal-operator` (kopf) on a slim Python, as a non-root user.
#
# Build from the repository root (the context must be the repository):
#   docker build -f images/operator.Dockerfile -t ghcr.io/tidal-serving/operator:0.1.0 .
# The chart (charts/tidal) runs it with a read-only root filesystem: nothing here writes to it.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# --- build: the project and its dependencies into a virtualenv, from the repository ---------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Only what the package is built from (tidal/ holds the links giving operator/, runtime/ and
# e2e/sandbox/ their import names; see pyproject.toml).
COPY pyproject.toml README.md ./
COPY tidal/ tidal/
COPY operator/ operator/
COPY runtime/ runtime/
COPY common/ common/
COPY e2e/sandbox/ e2e/sandbox/
# No extras: the operator needs only the base dependencies (the gpu extra is for runtime pods).
RUN python -m venv /opt/tidal \
 && /opt/tidal/bin/pip install --no-cache-dir . \
 && /opt/tidal/bin/tidal-operator --help > /dev/null

# --- final: the virtualenv alone ------------------------------------------------------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tidal-operator" \
      org.opencontainers.image.description="Kubernetes operator for elastic GPU inference" \
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

# syntax=docker/dockerfile:1
# The model store the chart can install (modelStore.enabled): versitygw, an S3-compatible
# gateway over a directory (its PersistentVolume), on a Debian base, as a non-root user.
#
# Build from the repository root:
#   docker build -f images/modelstore.Dockerfile -t ghcr.io/tidal-serving/tidal-model-store:0.1.0 .
# (names and version: common/release.py, checked by tests/charts/test_release_names.py).
# versitygw is compiled from the Go module proxy in the first stage: on GO_IMAGE (the official
# Go image by default; `make test` passes the Go toolchain of the machine it runs on, wrapped in
# a layer, as it passes a Debian base built from Debian's packages for BASE_IMAGE).
ARG GO_IMAGE=golang:1.26-bookworm
ARG BASE_IMAGE=debian:bookworm-slim

# --- build: versitygw, static (no cgo), at a pinned version ----------------------------------
FROM ${GO_IMAGE} AS build
ENV CGO_ENABLED=0 \
    GOFLAGS=-trimpath \
    GOTOOLCHAIN=local \
    GOBIN=/out
# Exec form: the stage needs no shell (the sandbox's Go image is the toolchain alone), and so
# no ARG reaches the command: the version is the sandbox's (TIDAL_VERSITYGW_VERSION's default).
RUN ["go", "install", "-ldflags=-s -w", "github.com/versity/versitygw/cmd/versitygw@v1.8.0"]

# --- final: the binary alone on Debian ------------------------------------------------------
FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="tidal-model-store" \
      org.opencontainers.image.description="S3-compatible model store (versitygw) for tidal's engines" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.source="https://github.com/tidal-serving/tidal" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/versitygw /usr/local/bin/versitygw
# A numeric user, so `runAsNonRoot: true` can verify it without a passwd lookup.
USER 65532:65532
# S3 on 7070; the chart mounts the PersistentVolume at /data (one directory per bucket).
EXPOSE 7070
ENTRYPOINT ["versitygw"]

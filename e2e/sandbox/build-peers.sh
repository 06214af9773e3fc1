#!/usr/bin/env bash
# Builds the real autoscaling peers the peers bench (bench/peers_bench.py) runs beside tidal, from
# the Go module proxy into a versioned cache outside the repo, like build-binaries.sh:
#   keda-<v>/bin/keda, keda-adapter   KEDA's operator and its external-metrics API server
#   keda-<v>/crds/*.yaml              KEDA's CRDs, copied from the same module
#   metrics-server-<v>/bin/metrics-server   the resource-metrics API server HPA's CPU target reads
# Reused when present: a second run costs nothing. Not part of `make test`. Progress goes to stderr.
#
#   TIDAL_KEDA_VERSION            default v2.21.0 (v2.21.1's go.mod asks for Go 1.27.4, newer than
#                                 the toolchain here; the proxy serves both)
#   TIDAL_METRICS_SERVER_VERSION  default v0.8.0
#   TIDAL_CACHE                   cache root (default ~/.cache/tidal)
set -euo pipefail

keda_version=${TIDAL_KEDA_VERSION:-v2.21.0}
ms_version=${TIDAL_METRICS_SERVER_VERSION:-v0.8.0}
cache=${TIDAL_CACHE:-$HOME/.cache/tidal}
keda_bin=$cache/keda-$keda_version/bin
ms_bin=$cache/metrics-server-$ms_version/bin

say() { printf '[peers-build] %s\n' "$*" >&2; }

keda_crds=$cache/keda-$keda_version/crds
if [ -x "$keda_bin/keda" ] && [ -x "$keda_bin/keda-adapter" ] && [ -f "$keda_crds/keda.sh_scaledobjects.yaml" ] \
  && [ -x "$ms_bin/metrics-server" ]; then
  say "binaries present in $keda_bin and $ms_bin"
  exit 0
fi
command -v go >/dev/null || { say "Go is required to build the peers (https://go.dev/dl)"; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod

# KEDA's go.mod has one replace and one exclude directive; a wrapper module must repeat them
# (directives of a dependency's go.mod do not apply to the module that requires it).
build_keda() {
  [ -x "$keda_bin/keda" ] && [ -x "$keda_bin/keda-adapter" ] && [ -f "$keda_crds/keda.sh_scaledobjects.yaml" ] \
    && return 0
  # The module's go.mod (for its directives) and its source (for the CRDs), one download.
  local info gomod src
  info=$(go mod download -json "github.com/kedacore/keda/v2@$keda_version") \
    || { say "could not download KEDA $keda_version"; exit 1; }
  gomod=$(sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' <<<"$info")
  src=$(sed -n 's/.*"Dir": "\(.*\)".*/\1/p' <<<"$info")
  mkdir -p "$cache/build/keda-$keda_version" "$keda_bin"
  cd "$cache/build/keda-$keda_version"
  {
    printf 'module tidal.dev/sandbox/keda\n\n%s\n\nrequire github.com/kedacore/keda/v2 %s\n\n' \
      "$(awk '$1=="go"{print; exit}' "$gomod")" "$keda_version"
    grep -E '^(replace|exclude) ' "$gomod"
  } > go.mod.tmp && mv go.mod.tmp go.mod
  local ldflags="-s -w -X github.com/kedacore/keda/v2/version.Version=${keda_version#v} -X github.com/kedacore/keda/v2/version.GitCommit=proxy"
  local name pkg start
  for pair in keda:cmd/operator keda-adapter:cmd/adapter; do
    name=${pair%%:*} pkg=github.com/kedacore/keda/v2/${pair#*:}
    [ -x "$keda_bin/$name" ] && continue
    say "building $name $keda_version (many minutes on 2 cores: KEDA links every scaler's SDK)"
    start=$SECONDS
    go build -trimpath -ldflags "$ldflags" -o "$keda_bin/$name.tmp" "$pkg"
    mv "$keda_bin/$name.tmp" "$keda_bin/$name"
    say "built $name in $((SECONDS - start)) s"
  done
  rm -rf "$keda_crds.tmp" && mkdir -p "$keda_crds.tmp"
  cp "$src"/config/crd/bases/*.yaml "$keda_crds.tmp/"
  rm -rf "$keda_crds" && mv "$keda_crds.tmp" "$keda_crds"
}

build_metrics_server() {
  [ -x "$ms_bin/metrics-server" ] && return 0
  local work=$cache/build/metrics-server-$ms_version
  mkdir -p "$work" "$ms_bin"
  cd "$work"
  printf 'module tidal.dev/sandbox/metrics-server\n\ngo 1.24.4\n\nrequire sigs.k8s.io/metrics-server %s\n' \
    "$ms_version" > go.mod
  say "building metrics-server $ms_version"
  local start=$SECONDS
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/metrics-server/pkg/version.gitVersion=$ms_version" \
    -o "$ms_bin/metrics-server.tmp" sigs.k8s.io/metrics-server/cmd/metrics-server
  mv "$ms_bin/metrics-server.tmp" "$ms_bin/metrics-server"
  say "built metrics-server in $((SECONDS - start)) s"
}

build_metrics_server
build_keda
say "done: $keda_bin, $ms_bin"

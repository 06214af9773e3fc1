#!/usr/bin/env bash
# Builds the Helm CLI from the Go module proxy into a versioned cache outside the repo, the way
# e2e/sandbox/build-binaries.sh builds the control plane: a small wrapper module that requires
# helm.sh/helm/v4, CGO_ENABLED=0, the version stamped through -ldflags like Helm's own Makefile.
# Reused when present: a second run costs nothing. Progress goes to stderr; the binary's path is
# printed on stdout so callers can do  helm=$(bash e2e/helm/build-helm.sh).
#
#   TIDAL_HELM_VERSION  Helm release (default v4.3.2, the newest v4 the proxy served when written)
#   TIDAL_CACHE         cache root (default ~/.cache/tidal)
set -euo pipefail

helm_version=${TIDAL_HELM_VERSION:-v4.3.2}
cache=${TIDAL_CACHE:-$HOME/.cache/tidal}
bin=$cache/helm-$helm_version/bin
major=$(echo "$helm_version" | cut -d. -f1) # v4 (or v3): the module path's major suffix
module=helm.sh/helm/$major

say() { printf '[helm-build] %s\n' "$*" >&2; }

if [ -x "$bin/helm" ]; then
  say "helm $helm_version present in $bin"
  echo "$bin/helm"
  exit 0
fi

command -v go >/dev/null || { say "Go is required to build helm (https://go.dev/dl)"; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod

work=$cache/build/helm-$helm_version
mkdir -p "$work" "$bin"
cd "$work"
if [ ! -f go.mod ]; then
  say "resolving $module@$helm_version"
  gomod=$(go mod download -json "$module@$helm_version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -n "$gomod" ] || { say "could not download $module@$helm_version"; exit 1; }
  go_directive=$(awk '$1=="go"{print $2; exit}' "$gomod")
  # Helm's go.mod has no replace directives, so requiring it is enough: minimal version
  # selection then picks exactly the dependency versions Helm itself was released with.
  cat > go.mod.tmp <<MOD
module tidal.dev/build/helm

go $go_directive

require $module $helm_version
MOD
  mv go.mod.tmp go.mod
fi

ldflags="-s -w -X $module/internal/version.version=$helm_version -X $module/internal/version.gitTreeState=clean"
say "building helm $helm_version (a few minutes on 2 cores)"
start=$SECONDS
go build -trimpath -ldflags "$ldflags" -o "$bin/helm.tmp" "$module/cmd/helm"
mv "$bin/helm.tmp" "$bin/helm"
say "built helm $helm_version in $((SECONDS - start)) s: $("$bin/helm" version --short 2>/dev/null || true)"
echo "$bin/helm"

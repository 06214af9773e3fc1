#!/usr/bin/env bash
# Builds the sandbox's real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) from the Go module proxy into a versioned cache outside the repo.
# Reused when present: a second run costs nothing. Progress goes to stderr.
#
#   TIDAL_K8S_VERSION   Kubernetes release (default v1.37.2)
#   TIDAL_ETCD_VERSION  etcd release (default v3.6.16)
#   TIDAL_VERSITYGW_VERSION  the S3-compatible object store (default v1.8.0)
#   TIDAL_REGISTRY_VERSION   the OCI registry, CNCF distribution (default v3.1.2)
#   TIDAL_CACHE         cache root (default ~/.cache/tidal)
set -euo pipefail

k8s_version=${TIDAL_K8S_VERSION:-v1.37.2}
etcd_version=${TIDAL_ETCD_VERSION:-v3.6.16}
cache=${TIDAL_CACHE:-$HOME/.cache/tidal}
bin=$cache/k8s-$k8s_version/bin
etcd_bin=$cache/etcd-$etcd_version/bin
prometheus_dir=$cache/prometheus
vgw_version=${TIDAL_VERSITYGW_VERSION:-v1.8.0}
vgw_bin=$cache/versitygw-$vgw_version/bin
registry_version=${TIDAL_REGISTRY_VERSION:-v3.1.2}
registry_bin=$cache/registry-$registry_version/bin
k8s_tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl)

say() { printf '[sandbox-build] %s\n' "$*" >&2; }

have_all() {
  for t in "${k8s_tools[@]}"; do [ -x "$bin/$t" ] || return 1; done
  [ -x "$etcd_bin/etcd" ] && [ -x "$prometheus_dir/usr/bin/prometheus" ] && [ -x "$vgw_bin/versitygw" ] \
    && [ -x "$registry_bin/registry" ]
}
if have_all; then
  say "binaries present in $bin and $etcd_bin"
  exit 0
fi

command -v go >/dev/null || { say "Go is required to build the sandbox (https://go.dev/dl)"; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-mod=mod
# Staging modules are versioned v0.M.P for Kubernetes v1.M.P.
staging_version=v0.${k8s_version#v1.}

build_k8s() {
  local work=$cache/build/k8s-$k8s_version
  mkdir -p "$work" "$bin"
  cd "$work"
  if [ ! -f go.mod ]; then
    say "resolving k8s.io/kubernetes@$k8s_version"
    local gomod
    gomod=$(go mod download -json "k8s.io/kubernetes@$k8s_version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    [ -n "$gomod" ] || { say "could not download k8s.io/kubernetes@$k8s_version"; exit 1; }
    local go_directive
    go_directive=$(awk '$1=="go"{print $2; exit}' "$gomod")
    {
      echo "module tidal.dev/sandbox/k8s"
      echo
      echo "go $go_directive"
      echo
      echo "godebug default=go${go_directive%.*}"
      echo
      echo "require k8s.io/kubernetes $k8s_version"
      echo
      echo "replace ("
      grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod" | awk -v v="$staging_version" '{print "\t" $1 " => " $1 " " v}'
      echo ")"
    } > go.mod.tmp && mv go.mod.tmp go.mod
  fi
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
  for t in "${k8s_tools[@]}"; do
    if [ -x "$bin/$t" ]; then continue; fi
    local pkg=k8s.io/kubernetes/cmd/$t
    say "building $t $k8s_version (several minutes on 2 cores)"
    local start=$SECONDS
    go build -trimpath -ldflags "$ldflags" -o "$bin/$t.tmp" "$pkg"
    mv "$bin/$t.tmp" "$bin/$t"
    say "built $t in $((SECONDS - start)) s"
  done
}

build_etcd() {
  [ -x "$etcd_bin/etcd" ] && return 0
  local work=$cache/build/etcd-$etcd_version
  mkdir -p "$work" "$etcd_bin"
  cd "$work"
  if [ ! -f go.mod ]; then
    cat > go.mod <<MOD
module tidal.dev/sandbox/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $etcd_version

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $etcd_version
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $etcd_version
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $etcd_version
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $etcd_version
)
MOD
  fi
  say "building etcd $etcd_version"
  local start=$SECONDS
  go build -trimpath -ldflags "-s -w" -o "$etcd_bin/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$etcd_bin/etcd.tmp" "$etcd_bin/etcd"
  say "built etcd in $((SECONDS - start)) s"
}

# A Go program whose module has no replace directives, built through a one-line wrapper module:
#   build_wrapped NAME MODULE VERSION GO_DIRECTIVE PACKAGE BIN_DIR [LDFLAGS]
build_wrapped() {
  local name=$1 module=$2 version=$3 go_directive=$4 pkg=$5 out=$6 ldflags="-s -w ${7:-}"
  [ -x "$out/$name" ] && return 0
  local work=$cache/build/$name-$version
  mkdir -p "$work" "$out"
  cd "$work"
  printf 'module tidal.dev/sandbox/%s\n\ngo %s\n\nrequire %s %s\n' \
    "$name" "$go_directive" "$module" "$version" > go.mod
  say "building $name $version"
  local start=$SECONDS
  go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$pkg"
  mv "$out/$name.tmp" "$out/$name"
  say "built $name in $((SECONDS - start)) s"
}

# The sandbox's object store (the cold tier users keep engines in): versitygw, an S3 gateway
# over a POSIX directory (MinIO and SeaweedFS are served only as pseudo-versions of their main
# branches).
build_versitygw() {
  build_wrapped versitygw github.com/versity/versitygw "$vgw_version" 1.25.0 \
    github.com/versity/versitygw/cmd/versitygw "$vgw_bin"
}

# The sandbox's OCI registry (the release script pushes images and the chart to it; the real
# node's containerd pulls from it): CNCF distribution.
build_registry() {
  local module=github.com/distribution/distribution/v3
  build_wrapped registry "$module" "$registry_version" 1.26.0 "$module/cmd/registry" \
    "$registry_bin" "-X $module/version.version=$registry_version"
}

fetch_prometheus() {
  [ -x "$prometheus_dir/usr/bin/prometheus" ] && return 0
  # Debian's package, unpacked into the cache: installing it would start a system service.
  local dl=$cache/dl
  mkdir -p "$dl"
  say "fetching Debian's prometheus package"
  if ! ls "$dl"/prometheus_*.deb >/dev/null 2>&1; then
    (cd "$dl" && apt-get download prometheus >/dev/null 2>&1) || {
      say "apt lists look stale; running apt-get update"
      apt-get update -qq >/dev/null
      (cd "$dl" && apt-get download prometheus >/dev/null 2>&1)
    }
  fi
  rm -rf "$prometheus_dir.tmp" && mkdir -p "$prometheus_dir.tmp"
  dpkg-deb -x "$dl"/prometheus_*.deb "$prometheus_dir.tmp"
  rm -rf "$prometheus_dir" && mv "$prometheus_dir.tmp" "$prometheus_dir"
  say "prometheus: $("$prometheus_dir/usr/bin/prometheus" --version 2>&1 | head -1)"
}

fetch_prometheus
build_etcd
build_k8s
build_versitygw
build_registry
say "done: $bin, $etcd_bin, $vgw_bin, $registry_bin"

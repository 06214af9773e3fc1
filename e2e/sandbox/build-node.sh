#!/usr/bin/env bash
# Builds what a real Kubernetes node of the sandbox needs, into a versioned cache outside the repo:
#   kubelet, kube-proxy      same release as the control plane (build-binaries.sh's wrapper module)
#   containerd 2.x, its runc shim, ctr, runc (cgo + seccomp), the CNI plugins, CoreDNS
#                            from the Go module proxy (`go install module/cmd@version`)
#   pause                    the Kubernetes pause container, compiled statically from its source
# and installs the Debian tools the node and the image builds use (buildah, mmdebstrap, nftables,
# libseccomp-dev for runc's headers) when they are missing. Reused when present: a second run
# costs nothing. Progress goes to stderr. Run build-binaries.sh first (the k8s wrapper module).
#
#   TIDAL_K8S_VERSION         Kubernetes release (default v1.37.2)
#   TIDAL_CONTAINERD_VERSION  default v2.4.2     TIDAL_RUNC_VERSION     default v1.5.3
#   TIDAL_CNI_VERSION         default v1.10.0    TIDAL_COREDNS_VERSION  default v1.15.0
#   TIDAL_CACHE               cache root (default ~/.cache/tidal)
set -euo pipefail

k8s_version=${TIDAL_K8S_VERSION:-v1.37.2}
containerd_version=${TIDAL_CONTAINERD_VERSION:-v2.4.2}
runc_version=${TIDAL_RUNC_VERSION:-v1.5.3}
cni_version=${TIDAL_CNI_VERSION:-v1.10.0}
coredns_version=${TIDAL_COREDNS_VERSION:-v1.15.0}
cache=${TIDAL_CACHE:-$HOME/.cache/tidal}
k8s_work=$cache/build/k8s-$k8s_version
bin=$cache/node-$k8s_version/bin
cni_bin=$cache/node-$k8s_version/cni
say() { printf '[node-build] %s\n' "$*" >&2; }
export GOFLAGS=-mod=mod

debian_tools() {
  local missing=()
  command -v buildah >/dev/null || missing+=(buildah)
  command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
  command -v nft >/dev/null || missing+=(nftables)
  [ -f /usr/include/seccomp.h ] || missing+=(libseccomp-dev)
  command -v gcc >/dev/null || missing+=(gcc libc6-dev)
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  # A stale package list fails the install; refresh it once and retry.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >/dev/null 2>&1 || {
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  }
}

timed() { # name, command...
  local name=$1 start=$SECONDS
  shift
  say "building $name"
  "$@"
  say "built $name in $((SECONDS - start)) s"
}

go_install() { # output-dir, tags, ldflags, package@version...
  local out=$1 tags=$2 ldflags=$3
  shift 3
  GOBIN=$out go install -trimpath -tags "$tags" -ldflags "$ldflags" "$@"
}

build_k8s_node() {
  [ -f "$k8s_work/go.mod" ] || { say "run build-binaries.sh first ($k8s_work/go.mod missing)"; exit 1; }
  local minor
  minor=$(echo "$k8s_version" | cut -d. -f2)
  local ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  for t in kubelet kube-proxy; do
    [ -x "$bin/$t" ] && continue
    # shellcheck disable=SC2016
    timed "$t $k8s_version" bash -c 'cd "$1" && CGO_ENABLED=0 go build -trimpath -ldflags "$2" -o "$3.tmp" "k8s.io/kubernetes/cmd/$4" && mv "$3.tmp" "$3"' \
      _ "$k8s_work" "$ldflags" "$bin/$t" "$t"
  done
}

build_containerd() {
  [ -x "$bin/containerd" ] && [ -x "$bin/containerd-shim-runc-v2" ] && [ -x "$bin/ctr" ] && return 0
  local m=github.com/containerd/containerd/v2
  local ld="-s -w -X $m/version.Version=$containerd_version -X $m/version.Package=$m -X $m/version.Revision=goproxy"
  CGO_ENABLED=0 timed "containerd $containerd_version" go_install "$bin" \
    "urfave_cli_no_docs no_btrfs no_devmapper no_zfs" "$ld" "$m/cmd/containerd@$containerd_version"
  CGO_ENABLED=0 timed "containerd-shim-runc-v2" go_install "$bin" "urfave_cli_no_docs no_grpc" "$ld" \
    "$m/cmd/containerd-shim-runc-v2@$containerd_version"
  CGO_ENABLED=0 timed "ctr" go_install "$bin" "urfave_cli_no_docs" "$ld" "$m/cmd/ctr@$containerd_version"
}

build_runc() {
  [ -x "$bin/runc" ] && return 0
  # cgo: runc's nsenter is C; seccomp needs libseccomp's headers and library (Debian's -dev).
  CGO_ENABLED=1 timed "runc $runc_version" go_install "$bin" "seccomp urfave_cli_no_docs" \
    "-s -w -X main.gitCommit=$runc_version" "github.com/opencontainers/runc@$runc_version"
}

build_cni() {
  [ -x "$cni_bin/bridge" ] && [ -x "$cni_bin/host-local" ] && [ -x "$cni_bin/loopback" ] && return 0
  local m=github.com/containernetworking/plugins
  CGO_ENABLED=0 timed "CNI plugins $cni_version" go_install "$cni_bin" "" \
    "-s -w -X $m/pkg/utils/buildversion.BuildVersion=$cni_version" \
    "$m/plugins/main/bridge@$cni_version" "$m/plugins/ipam/host-local@$cni_version" \
    "$m/plugins/main/loopback@$cni_version"
}

build_coredns() {
  [ -x "$bin/coredns" ] && return 0
  # Only the plugins the sandbox's Corefile uses, compiled into CoreDNS's own main (the
  # project's documented way to choose plugins at compile time): the full plugin set brings in
  # every cloud provider's SDK and costs minutes of a 2-core build.
  local work=$cache/build/coredns-$coredns_version
  mkdir -p "$work"
  cat > "$work/main.go" <<'GO'
// CoreDNS with the plugins of the tidal sandbox's cluster DNS only (see build-node.sh).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"errors", "health", "ready", "kubernetes", "cache", "loadbalance"}
}

func main() { coremain.Run() }
GO
  if [ ! -f "$work/go.mod" ]; then
    local go_directive
    go_directive=$(go mod download -json "github.com/coredns/coredns@$coredns_version" \
      | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p' | xargs awk '$1=="go"{print $2; exit}')
    printf 'module tidal.dev/sandbox/coredns\n\ngo %s\n\nrequire github.com/coredns/coredns %s\n' \
      "$go_directive" "$coredns_version" > "$work/go.mod"
  fi
  # shellcheck disable=SC2016
  CGO_ENABLED=0 timed "coredns $coredns_version (cluster DNS plugins)" bash -c \
    'cd "$1" && go build -trimpath -ldflags "-s -w" -o "$2.tmp" . && mv "$2.tmp" "$2"' \
    _ "$work" "$bin/coredns"
}

build_pause() {
  [ -x "$bin/pause" ] && return 0
  local src
  src=$(cd "$k8s_work" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
  timed "pause" gcc -Os -Wall -Werror -static -DVERSION="$k8s_version-tidal" -o "$bin/pause" "$src"
}

have_all() {
  for t in kubelet kube-proxy containerd containerd-shim-runc-v2 ctr runc coredns pause; do
    [ -x "$bin/$t" ] || return 1
  done
  [ -x "$cni_bin/bridge" ] && command -v buildah >/dev/null && command -v mmdebstrap >/dev/null \
    && command -v nft >/dev/null
}
if have_all; then
  say "node binaries present in $bin"
  exit 0
fi
mkdir -p "$bin" "$cni_bin"
debian_tools
build_runc
build_cni
build_containerd
build_pause
build_coredns
build_k8s_node
say "done: $bin"

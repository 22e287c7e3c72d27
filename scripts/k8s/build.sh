#!/usr/bin/env bash
# Builds the test cluster's binaries from the Go module proxy, once, and caches them by
# version under ~/.cache/roche/k8s-<version>/: kube-apiserver, kube-controller-manager,
# kube-scheduler and kubelet (Kubernetes 1.34), etcd, kwok, cri-clean (scripts/k8s/cri-clean,
# which cluster.sh down uses to remove Pods through the CRI), and the cluster's volume
# provisioner, roche-test-provisioner (internal/testcluster/cmd/roche-test-provisioner, over
# sigs.k8s.io/sig-storage-lib-external-provisioner; a module of its own), cached by the hash
# of its sources as roche-test-provisioner-HASH, which the link roche-test-provisioner names.
# Idempotent: a binary that is already there is not built again. A cold build takes 10-25
# minutes on two cores.
#
# gVisor's runsc and its containerd shim (containerd-shim-runsc-v1), for the node's runsc
# runtime handler (RuntimeClass gvisor), are cached apart, by gVisor's version, under
# ~/.cache/roche/runsc/<version>/: the version scripts/runsc.sh pins for Docker's runsc, from
# gVisor's "go" branch on the Go module proxy (runsc is shared with it; the shim is built once,
# about 4 minutes, with the one change said below).
#
#   scripts/k8s/build.sh            (make cluster runs it)
#
# k8s.io/kubernetes replaces its staging modules with directories that are not in its
# module zip, so `go install k8s.io/kubernetes/cmd/...@v1.34.4` is refused; a scratch
# module that requires k8s.io/kubernetes and replaces each staging module with its
# published k8s.io/* v0.34.x builds them. etcd's server module likewise.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.4}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
cache=${ROCHE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/roche/k8s-$K8S_VERSION}
work=${cache}/build
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$cache" "$work"

log() { printf 'k8s-build: %s\n' "$*" >&2; }

# One build at a time per cache: make test's set-up job, a `make cluster` and another
# checkout's run share the binaries and the scratch modules below. The second waits,
# then finds what the first built.
exec 8>"$cache/.build.lock"
if ! flock -n 8; then
  log "another build of $cache is running; waiting for it"
  flock 8
fi

k8s_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubelet)

# The scratch module that builds Kubernetes' commands (and cri-clean, with the same
# dependency versions: `go get CMD@K8S_VERSION` resolves them from Kubernetes' own go.mod).
# A module is made in a directory of its own and moved into place when whole, so that one
# an interrupted run left half made is made again rather than found and used.
mod="$work/k8s"
prepare_k8s_module() {
  [ -f "$mod/go.mod" ] && return 0
  log "preparing a module for k8s.io/kubernetes $K8S_VERSION"
  local new=$mod.new src staging m
  rm -rf "$new" && mkdir -p "$new"
  (cd "$new" && go mod init roche.invalid/k8sbuild >/dev/null 2>&1)
  (cd "$new" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null)
  src=$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION
  staging=v0.${K8S_VERSION#v1.}
  (cd "$new" && go mod edit -go="$(awk '/^go /{print $2; exit}' "$src/go.mod")")
  for m in $(sed -n '/^replace (/,/^)/p' "$src/go.mod" | awk '/=>/{print $1}'); do
    (cd "$new" && go mod edit -replace="$m=$m@$staging")
  done
  (cd "$new" && go mod edit -require="k8s.io/kubernetes@$K8S_VERSION")
  rm -rf "$mod" && mv "$new" "$mod"
}
get_cmd() {
  (cd "$mod" && go get "k8s.io/kubernetes/cmd/$1@$K8S_VERSION" >/dev/null 2>&1) || (cd "$mod" && go get "k8s.io/kubernetes/cmd/$1@$K8S_VERSION")
}

missing=()
for c in "${k8s_cmds[@]}"; do [ -x "$cache/$c" ] || missing+=("$c"); done
if [ ${#missing[@]} -gt 0 ]; then
  prepare_k8s_module
  for c in "${missing[@]}"; do get_cmd "$c"; done
  for c in "${missing[@]}"; do
    log "building $c $K8S_VERSION (minutes)"
    (cd "$mod" && CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
      -o "$cache/$c.tmp" "k8s.io/kubernetes/cmd/$c")
    mv -f "$cache/$c.tmp" "$cache/$c"
  done
fi

# cri-clean needs k8s.io/cri-api and gRPC at the versions the kubelet uses; the project's
# go.mod stays free of them.
if [ ! -x "$cache/cri-clean" ] || [ "$here/cri-clean/main.go" -nt "$cache/cri-clean" ]; then
  prepare_k8s_module
  get_cmd kubelet
  log "building cri-clean"
  mkdir -p "$mod/cmd/cri-clean"
  sed '/^\/\/go:build ignore$/d' "$here/cri-clean/main.go" >"$mod/cmd/cri-clean/main.go"
  (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$cache/cri-clean.tmp" ./cmd/cri-clean)
  mv -f "$cache/cri-clean.tmp" "$cache/cri-clean"
fi

if [ ! -x "$cache/etcd" ]; then
  mod="$work/etcd"
  if [ ! -f "$mod/go.mod" ]; then
    rm -rf "$mod.new" && mkdir -p "$mod.new"
    (cd "$mod.new" && go mod init roche.invalid/etcdbuild >/dev/null 2>&1)
    for m in go.etcd.io/etcd/api/v3 go.etcd.io/etcd/client/pkg/v3 go.etcd.io/etcd/client/v3 go.etcd.io/etcd/pkg/v3; do
      (cd "$mod.new" && go mod edit -replace="$m=$m@$ETCD_VERSION")
    done
    (cd "$mod.new" && go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
    rm -rf "$mod" && mv "$mod.new" "$mod"
  fi
  log "building etcd $ETCD_VERSION"
  (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$cache/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv -f "$cache/etcd.tmp" "$cache/etcd"
fi

if [ ! -x "$cache/kwok" ]; then
  log "building kwok $KWOK_VERSION"
  GOBIN="$work/kwok-bin" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
  mv -f "$work/kwok-bin/kwok" "$cache/kwok"
fi
# The volume provisioner: built again when its sources change. Old builds are kept: one may
# still run (cluster.sh restarts it on the new one by its recorded path).
prov_src=$here/../../internal/testcluster/cmd/roche-test-provisioner
prov=roche-test-provisioner-$(cat "$prov_src/main.go" "$prov_src/go.mod" "$prov_src/go.sum" | sha256sum | cut -c1-16)
if [ ! -x "$cache/$prov" ]; then
  log "building roche-test-provisioner"
  (cd "$prov_src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$cache/$prov.tmp" .)
  mv -f "$cache/$prov.tmp" "$cache/$prov"
fi
ln -sfn "$prov" "$cache/roche-test-provisioner"

# gVisor: the version scripts/runsc.sh pins, so the node and Docker run the same runsc.
runsc_version=${ROCHE_RUNSC_VERSION:-$(sed -n 's/^version=\${ROCHE_RUNSC_VERSION:-\(v[^}]*\)}$/\1/p' "$here/../runsc.sh")}
[ -n "$runsc_version" ] || { log "no gVisor version in scripts/runsc.sh"; exit 1; }
gvisor=${ROCHE_CACHE:-${HOME:-/root}/.cache/roche}/runsc/$runsc_version
mkdir -p "$gvisor"
# scripts/runsc.sh builds the same runsc into the same place (make test runs both at once):
# whichever comes second waits on the lock and finds the binary made.
exec 9>"$gvisor/.build.lock"
flock 9
if [ ! -x "$gvisor/runsc" ]; then
  log "building runsc $runsc_version"
  CGO_ENABLED=0 GOBIN="$gvisor" GOFLAGS=-buildvcs=false go install -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$runsc_version" "gvisor.dev/gvisor/runsc@$runsc_version"
fi
exec 9>&-
# The shim, from a copy of the module with one change: its start makes the shim
# unkillable by the OOM killer (oom_score_adj -999), which takes CAP_SYS_RESOURCE, and fails
# the Pod without it; on hosts whose root lacks it (this one, as the containerd
# configuration's restrict_oom_score_adj says) the shim keeps containerd's score instead.
# And one setting: the shim finds a Pod's volumes, for gVisor's mount hints (the Pod's
# dev.gvisor.spec.mount.* annotations), under the kubelet's pods directory, which it takes
# to be the default root's (/var/lib/kubelet/pods); the test cluster's kubelet keeps its
# root in the cluster's state directory, so the shim is linked with that one
# (ROCHE_KUBELET_PODS_DIR, from cluster.sh) and built again when it changes.
pods_dir=${ROCHE_KUBELET_PODS_DIR:-${ROCHE_CLUSTER_DIR:-/var/lib/roche-cluster}/kubelet/pods}
if [ ! -x "$gvisor/containerd-shim-runsc-v1" ] || [ "$(cat "$gvisor/containerd-shim-runsc-v1.pods-dir" 2>/dev/null)" != "$pods_dir" ]; then
  log "building containerd-shim-runsc-v1 $runsc_version (minutes, once)"
  (cd "$work" && go mod download "gvisor.dev/gvisor@$runsc_version")
  src=$work/gvisor-$runsc_version
  rm -rf "$src"
  cp -r "$(go env GOMODCACHE)/gvisor.dev/gvisor@$runsc_version" "$src"
  chmod -R u+w "$src"
  # (Silently: what start prints is read as the shim's address.)
  sed -i 's|return shim.BootstrapParams{}, fmt.Errorf("failed to set OOM Score on shim: %w", err)|_ = err // roche: not setting the OOM score of the shim, without CAP_SYS_RESOURCE|' "$src/pkg/shim/v1/manager.go"
  grep -q 'roche: not setting the OOM score of the shim' "$src/pkg/shim/v1/manager.go" || { log "gVisor's shim changed: the OOM score change does not apply to $src/pkg/shim/v1/manager.go"; exit 1; }
  grep -q '^var kubeletPodsDir = "/var/lib/kubelet/pods"$' "$src/pkg/shim/v1/utils/volumes.go" || { log "gVisor's shim changed: no kubeletPodsDir in $src/pkg/shim/v1/utils/volumes.go"; exit 1; }
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/pkg/shim/v1/utils.kubeletPodsDir=$pods_dir" -o "$gvisor/containerd-shim-runsc-v1.tmp" ./shim)
  mv -f "$gvisor/containerd-shim-runsc-v1.tmp" "$gvisor/containerd-shim-runsc-v1"
  echo "$pods_dir" >"$gvisor/containerd-shim-runsc-v1.pods-dir"
  rm -rf "$src"
fi
log "binaries in $cache and $gvisor"
echo "$cache"

#!/usr/bin/env bash
# Registers gVisor's runsc as the Docker runtime "runsc" (docker provider, --runtime runsc):
# builds a pinned runsc from the Go module proxy once (cached under ~/.cache/roche),
# installs it under /usr/local/lib/roche, merges the runtime into /etc/docker/daemon.json
# (keeping whatever else is there), and, when dockerd runs, asks it to reload its runtimes
# with a SIGHUP; a dockerd started afterwards reads the file itself.
#
# Why not Debian's runsc (20221219): its control socket is an abstract unix socket in the
# host's network namespace, which any local user can connect to (there is no file mode
# on an abstract socket) and which runs a command as root with every capability inside
# any sandbox; and its /proc lets the sandbox user read the agent's environ, maps and
# auxv and list its descriptors, and its tmpfs lets it mknod devices. gVisor has since
# made the control socket a file in runsc's state directory (root's, 0711; the socket
# 0755, so only root connects), and refuses those /proc reads and mknod as Linux does.
#
# It runs with --network=none (Roche refuses network on gVisor: a sandbox has only
# loopback), --host-uds=all so that roche-agent can serve its socket (create) and reach
# the egress proxy's (open) through the bind-mounted socket directory, --oci-seccomp so
# that gVisor's kernel enforces the seccomp profile Roche gives each container, and
# --overlay2=none so that what a sandbox writes goes to its container's layer (where the
# disk limit bounds it and a snapshot finds it) rather than to gVisor's memory.
#
#   bash scripts/runsc.sh        (needs root and Go; scripts/test.sh runs it)
set -euo pipefail

conf=${ROCHE_DOCKER_CONFIG:-/etc/docker/daemon.json}
runtime=${ROCHE_RUNSC_NAME:-runsc}
# gVisor's "go" branch, as the Go module proxy serves it (go list -m gvisor.dev/gvisor@go).
version=${ROCHE_RUNSC_VERSION:-v0.0.0-20260905035102-160fafc42237}
cache=${ROCHE_CACHE:-${HOME:-/root}/.cache/roche}/runsc/$version
path=/usr/local/lib/roche/runsc/$version/runsc

if ! command -v jq >/dev/null 2>&1; then
  echo "== installing jq"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends jq >/dev/null
fi

# scripts/k8s/build.sh builds the same runsc into the same place, and make test runs the
# two at once: whichever comes second waits on the lock and finds the binary made.
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9
if [ ! -x "$cache/runsc" ]; then
  echo "== building runsc $version from the Go module proxy (once; cached in $cache)"
  CGO_ENABLED=0 GOBIN="$cache" GOFLAGS=-buildvcs=false go install -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$version" "gvisor.dev/gvisor/runsc@$version"
fi
exec 9>&-
if ! cmp -s "$cache/runsc" "$path"; then
  install -D -m 0755 "$cache/runsc" "$path"
fi

want=$(jq -n --arg path "$path" '{path: $path, runtimeArgs: ["--network=none", "--host-uds=all", "--oci-seccomp", "--overlay2=none"]}')
mkdir -p "$(dirname "$conf")"
[ -s "$conf" ] || echo '{}' >"$conf"
if jq -e --arg rt "$runtime" --argjson want "$want" '.runtimes[$rt] == $want' "$conf" >/dev/null; then
  exit 0
fi
tmp=$(mktemp "$conf.XXXXXX")
jq --arg rt "$runtime" --argjson want "$want" '.runtimes[$rt] = $want' "$conf" >"$tmp"
chmod 0644 "$tmp"
mv "$tmp" "$conf"
echo "== registered $path as the Docker runtime $runtime in $conf"

pid=$(cat /var/run/docker.pid 2>/dev/null || true)
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
  kill -HUP "$pid"
  for _ in $(seq 1 20); do
    timeout 5 docker info --format '{{json .Runtimes}}' 2>/dev/null | jq -e --arg rt "$runtime" --arg path "$path" '.[$rt].path == $path' >/dev/null && exit 0
    sleep 0.5
  done
  echo "dockerd (pid $pid) did not pick up the runtime $runtime after a SIGHUP; check $conf and its log" >&2
  exit 1
fi

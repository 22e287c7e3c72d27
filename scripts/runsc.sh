#!/usr/bin/env bash
# Registers gVisor's runsc as the Docker runtime "runsc" (docker provider, --runtime runsc):
# installs it from Debian when absent, merges the runtime into /etc/docker/daemon.json
# (keeping whatever else is there), and, when dockerd runs, asks it to reload its runtimes
# with a SIGHUP; a dockerd started afterwards reads the file itself.
#
# Debian's runsc (20221219) cannot set up its own network stack on these machines, so it
# runs with --network=none (a sandbox has only loopback: Roche refuses network on it), and
# with --host-uds=all so that roche-agent can serve its socket (create) and reach the
# egress proxy's (open) through the bind-mounted socket directory, and with --oci-seccomp
# so that gVisor's kernel enforces the seccomp profile Roche gives each container.
#
#   bash scripts/runsc.sh        (needs root; scripts/test.sh runs it)
set -euo pipefail

conf=${ROCHE_DOCKER_CONFIG:-/etc/docker/daemon.json}
runtime=${ROCHE_RUNSC_NAME:-runsc}

need=()
command -v runsc >/dev/null 2>&1 || need+=(runsc)
command -v jq >/dev/null 2>&1 || need+=(jq)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

path=$(command -v runsc)
want=$(jq -n --arg path "$path" '{path: $path, runtimeArgs: ["--network=none", "--host-uds=all", "--oci-seccomp"]}')
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
    timeout 5 docker info --format '{{json .Runtimes}}' 2>/dev/null | jq -e --arg rt "$runtime" 'has($rt)' >/dev/null && exit 0
    sleep 0.5
  done
  echo "dockerd (pid $pid) did not pick up the runtime $runtime after a SIGHUP; check $conf and its log" >&2
  exit 1
fi

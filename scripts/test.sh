#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine with Go: installs what the tests need
# (docker.io, debootstrap; e2fsprogs for disk limits; for the microVMs qemu-system-x86,
# linux-image-amd64, xz-utils, cpio), starts dockerd when nothing answers on its socket,
# checks that it can bound disks (overlay2, loop devices), builds the
# local test image and fetches python.wasm when absent, starts the test Kubernetes cluster
# (scripts/k8s/cluster.sh), then runs every test and checks that no sandbox was leaked.
# Needs root for apt-get and dockerd (as CI has).
#
#   make test        (or: bash scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*"; }

# Disk: the suite writes images, root filesystems and a build cache of several GiB. On a
# machine whose disk is nearly full, Go's build cache (which Go itself trims only of
# entries unused for five days) gives back what was not used in the last day.
avail_kib=$(df -Pk / | awk 'NR==2 {print $4}')
if [ "${avail_kib:-0}" -lt $((20 * 1024 * 1024)) ]; then
  gocache=$(go env GOCACHE)
  log "only $((avail_kib / 1024 / 1024)) GiB free on /: trimming Go's build cache ($gocache) of entries unused for a day"
  find "$gocache" -type f -mmin +1440 -delete 2>/dev/null || true
  log "now $(df -Pk / | awk 'NR==2 {print int($4/1024/1024)}') GiB free on /"
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  log "installing docker.io and debootstrap"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi

# The microVM providers (provider/vm): QEMU, a Debian guest kernel with its modules,
# mkfs.ext4 for root filesystems (and for the sized filesystems that bound Docker
# sandboxes' writable roots and workspaces), xz to uncompress the kernel, cpio to check
# initramfs.
vm_need=()
command -v qemu-system-x86_64 >/dev/null 2>&1 || vm_need+=(qemu-system-x86)
compgen -G '/boot/vmlinuz-*' >/dev/null || vm_need+=(linux-image-amd64)
command -v mkfs.ext4 >/dev/null 2>&1 || vm_need+=(e2fsprogs)
command -v xz >/dev/null 2>&1 || vm_need+=(xz-utils)
command -v cpio >/dev/null 2>&1 || vm_need+=(cpio)
if [ ${#vm_need[@]} -gt 0 ]; then
  log "installing ${vm_need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${vm_need[@]}" >/dev/null
fi

# The oci provider (provider/oci) runs sandboxes with an OCI runtime binary: crun (the
# default where it works; on hybrid cgroup hosts without the cgroup2 mount, see
# docs/providers/oci.md) and runc.
oci_need=()
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || oci_need+=(runc)
command -v crun >/dev/null 2>&1 || oci_need+=(crun)
if [ ${#oci_need[@]} -gt 0 ]; then
  log "installing ${oci_need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${oci_need[@]}" >/dev/null
fi

# tmux: the roche shell tests (internal/cli) run it as a real terminal.
if ! command -v tmux >/dev/null 2>&1; then
  log "installing tmux"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null
fi

# tcpdump: internal/daemon's TestTLSCaptureShowsNoToken captures roched's port on lo.
if ! command -v tcpdump >/dev/null 2>&1; then
  log "installing tcpdump"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tcpdump >/dev/null
fi

# chromium: internal/daemon's TestConsoleInABrowser drives roched's console headless
# (with puppeteer-core, installed below once Node is there).
if ! command -v chromium >/dev/null 2>&1; then
  log "installing chromium"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

# gVisor's runsc as the Docker runtime "runsc" (provider/docker's TestConformanceRunsc,
# --runtime runsc): installed and merged into /etc/docker/daemon.json, which a running
# dockerd reloads on the SIGHUP the script sends and one started below reads.
bash scripts/runsc.sh

if ! timeout 10 docker info >/dev/null 2>&1; then
  log "starting dockerd (log: /var/log/roche-dockerd.log)"
  nohup dockerd >/var/log/roche-dockerd.log 2>&1 &
  for i in $(seq 1 60); do
    timeout 5 docker info >/dev/null 2>&1 && break
    [ "$i" = 60 ] && { echo "dockerd did not answer within 60 s; see /var/log/roche-dockerd.log" >&2; tail -n 20 /var/log/roche-dockerd.log >&2; exit 1; }
    sleep 1
  done
fi

# Disk limits: a Docker sandbox's writable root is bounded by an ext4 filesystem that Roche
# loop-mounts under the engine's overlay2 layer (docs/limits.md, "Disk limits"). With another
# storage driver every writable-root test would fail on the refusal; say so once, here.
driver=$(timeout 10 docker info --format '{{.Driver}}' 2>/dev/null || true)
if [ "$driver" != overlay2 ]; then
  echo "the Docker engine's storage driver is '${driver:-unknown}', and Roche bounds a writable root's disk on overlay2 only:" >&2
  echo "the writable-root tests would fail. Run dockerd with --storage-driver overlay2 (the default on ext4 and xfs)." >&2
  exit 1
fi
if [ ! -e /dev/loop-control ] && ! compgen -G '/dev/loop[0-9]*' >/dev/null; then
  echo "no loop devices (/dev/loop-control): Roche's disk limits need them; load the loop module (modprobe loop)" >&2
  exit 1
fi

log "test image"
bash scripts/build-test-image.sh roche/python:local

# The test cluster (CONTRIBUTING.md, "The test cluster") for the Kubernetes tests: a real single-node
# Kubernetes, started here and stopped when the suite ends, unless it was already up (then
# it stays). On a fresh machine its binaries are built once first (10-25 minutes, cached
# under ~/.cache/roche).
log "test cluster"
cluster_was_up=false
if bash scripts/k8s/cluster.sh env >/dev/null 2>&1; then cluster_was_up=true; fi
cluster_env=$(bash scripts/k8s/cluster.sh up)
if [ "$cluster_was_up" = false ]; then
  trap 'log "stopping the test cluster"; bash scripts/k8s/cluster.sh down || true' EXIT
fi
eval "$cluster_env"

if [ -f scripts/fetch-python-wasm.sh ]; then
  log "python.wasm"
  bash scripts/fetch-python-wasm.sh
fi

# Workspaces and snapshots outlive sandboxes, so a test that forgets one leaks it
# silently; what exists now is compared with what exists at the end.
kept() {
  docker volume ls -q --filter name=roche-ws- | sort
  for d in "${HOME}/.local/share/roche/docker" /var/lib/roche/docker; do
    if [ -d "$d/workspaces" ]; then find "$d/workspaces" -mindepth 1 -maxdepth 2 ! -name '*.lock' ! -path "$d/workspaces/mnt"; fi
  done | sort
  # A sized layer left attached to a loop device would be a sandbox's disk not given back.
  losetup -l -n -O BACK-FILE 2>/dev/null | grep 'roche-disk\.img' | sort || true
  docker images --filter reference='roche-snapshot:*' --format '{{.Repository}}:{{.Tag}}' | sort
  for d in "${HOME}/.local/share/roche/wasm" /var/lib/roche/wasm; do
    for kind in workspaces snapshots; do
      if [ -d "$d/$kind" ]; then find "$d/$kind" -mindepth 1 -maxdepth 1; fi
    done
  done | sort
}
kept_before=$(kept)
# The agent socket directories of docker sandboxes. Only new ones count: a create's sweep
# (or roche gc) may remove those older runs left.
agent_dirs() {
  if [ -d /run/roche/docker ]; then find /run/roche/docker -mindepth 1 -maxdepth 2 -type d -name 'roche-*'; fi | sort
}
agent_dirs_before=$(agent_dirs)

# Python 3.10+ for the Python SDK: its own tests (below) and deploy/kubernetes's Go test,
# which runs it against roched in the test cluster; and, for the offline install tests,
# pip, setuptools and wheel, and venv (the wheel of make dist is installed into a fresh venv).
if ! python3 -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null \
   || ! /usr/bin/python3 -c 'import setuptools, wheel, pip' >/dev/null 2>&1 \
   || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  log "installing python3"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-pip python3-setuptools python3-wheel python3-venv >/dev/null
fi

# Node 18+ and npm for the TypeScript SDK (the machine image has Node 20; Debian's
# packages otherwise): its tests below, and the README's TypeScript quick start, which
# internal/quickstart runs offline from npm's cache, filled here from the lockfile.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
(cd sdk/typescript && npm ci --no-audit --no-fund >/dev/null)
# The console's browser test (internal/daemon TestConsoleInABrowser) drives Debian's
# chromium with puppeteer-core, pinned in its lockfile; no browser is downloaded.
(cd internal/daemon/testdata/console-browser && npm ci --ignore-scripts --no-audit --no-fund >/dev/null)
# The quick start then installs the SDK into a project (npm install ./sdk/typescript),
# which needs the registry's metadata of its dependencies: fetched here, in a copy.
qs=$(mktemp -d)
mkdir -p "$qs/sdk" && cp -r sdk/typescript "$qs/sdk/"
(cd "$qs" && npm install --no-audit --no-fund ./sdk/typescript >/dev/null)
rm -rf "$qs"

# E2B's official SDKs, pinned, for internal/e2b's tests (a venv under ~/.cache/roche/e2b
# from PyPI, node_modules from npm's lockfile).
log "e2b sdks"
bash scripts/e2b-sdks.sh >/dev/null

log "gofmt, go vet, staticcheck, go mod tidy"
make -s vet

log "go test"
# The full tier: every test runs, and one whose need is missing fails (testenv.Needs).
export ROCHE_TEST_TIER=full
# Kept test artifacts (the console's screenshots): test-artifacts/ in the checkout.
export ROCHE_TEST_ARTIFACTS="${ROCHE_TEST_ARTIFACTS:-$PWD/test-artifacts}"
# One package at a time: packages share the one Docker engine, and a test of
# `roche gc --all` or of the daemon's reconciliation must not reap another package's
# sandboxes mid-test.
# CGO_ENABLED=0, as roche-agent is built: the agent's in-process tests (internal/guest/server)
# test the program that runs in sandboxes, which is static.
# The escape suite (./escape) is among them: it attacks every provider with what this
# script set up (dockerd with runsc, crun and runc, the test cluster, QEMU, python.wasm)
# and fails when docs/escapes.md differs from what it saw.
CGO_ENABLED=0 go test -p 1 -count=1 -timeout 60m ./...

# The race detector (it needs cgo) over the tests written for it: a provider's Close
# while lease teardowns still run its OCI runtime.
log "go test -race"
go test -race -count=1 -run 'TestCloseSealedDuringRuns' ./provider/oci

# Every fuzz target for a few seconds (their seed corpora ran above as plain tests);
# make fuzz runs them longer.
log "fuzz (scripts/fuzz.sh, 3 s a target)"
FUZZTIME=3s bash scripts/fuzz.sh

log "python sdk (sdk/python/tests: the real roched and CLI from bin/, both transports)"
make build
python3 -m unittest discover -s sdk/python/tests -t sdk/python/tests -v

log "typescript sdk (sdk/typescript/test: the real roched and CLI from bin/, both transports)"
(cd sdk/typescript && npm ci --no-audit --no-fund && npm test)

left=$(docker ps -aq --filter label=roche.managed=true | wc -l)
if [ "$left" != 0 ]; then
  echo "$left container(s) labelled roche.managed=true survived the suite:" >&2
  docker ps -a --filter label=roche.managed=true >&2
  exit 1
fi
# A VM's directory is the VM. Beside it, a VM that ended leaves the record of how
# (.ID.ended.json), which the process watching it reads and removes at once, and which a
# VM ending after its roched stopped (a leased one, its grace after) leaves for the
# provider's next listing to remove once ten minutes old: not a VM.
if [ -d /run/roche/vm ] && [ -n "$(ls -A /run/roche/vm | grep -v '^\..*\.ended\.json$')" ]; then
  echo "microVM(s) survived the suite:" >&2
  ls -l /run/roche/vm >&2
  exit 1
fi
new_agent_dirs=$(comm -13 <(echo "$agent_dirs_before") <(agent_dirs))
if [ -n "$new_agent_dirs" ]; then
  echo "agent directories of docker sandboxes made by the suite survived it:" >&2
  ls -ld --full-time $new_agent_dirs >&2
  exit 1
fi
kept_after=$(kept)
if [ "$kept_before" != "$kept_after" ]; then
  echo "workspaces, snapshots or sized disks made by the suite survived it:" >&2
  diff <(echo "$kept_before") <(echo "$kept_after") >&2
  exit 1
fi
log "all tests passed; no sandbox, agent directory, workspace or snapshot left behind"

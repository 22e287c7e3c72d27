#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine with Go: installs what the tests need
# (docker.io, debootstrap; e2fsprogs for disk limits; for the microVMs qemu-system-x86,
# linux-image-amd64, xz-utils, cpio), starts dockerd when nothing answers on its socket,
# checks that it can bound disks (overlay2, loop devices), builds the
# local test image and fetches python.wasm when absent, starts the test Kubernetes cluster
# (scripts/k8s/cluster.sh), then runs every test and checks that no sandbox was leaked.
# Needs root for apt-get and dockerd (as CI has).
#
# The slow set-up steps (the test cluster's binaries, built from source on a fresh
# machine; the test image; python.wasm; runsc; the npm and E2B SDK installs) run in the
# background, each with its log, and the tests run as two streams of packages at once
# (see "go test" below). Every log is kept in test-artifacts/logs/; each line this script
# prints starts with the seconds since it began, and the last lines list what each step
# took.
#
#   make test        (or: bash scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== [%4d s] %s\n' "$SECONDS" "$*"; }

# Kept test artifacts (the console's screenshots) and this run's logs: test-artifacts/ in
# the checkout.
export ROCHE_TEST_ARTIFACTS="${ROCHE_TEST_ARTIFACTS:-$PWD/test-artifacts}"
logs=$ROCHE_TEST_ARTIFACTS/logs
rm -rf "$logs"
mkdir -p "$logs"
: >"$logs/times"

# ---------- background steps ----------
#
# job NAME COMMAND...: runs COMMAND (a function of this script too) in the background, in
# a process group of its own, with set -euo pipefail; its output goes to $logs/NAME.log,
# its exit status to $logs/NAME.rc. await NAME (from this shell or a stream below) waits
# for it and fails, with the end of its log, if it failed.
declare -A job_pid=()
job() {
  local name=$1
  shift
  set -m
  (
    trap - EXIT
    set +e
    t0=$SECONDS
    (set -euo pipefail; "$@")
    rc=$?
    echo "$name: $((SECONDS - t0)) s (exit $rc)" >>"$logs/times"
    echo "$rc" >"$logs/$name.rc"
  ) >"$logs/$name.log" 2>&1 </dev/null &
  job_pid[$name]=$!
  set +m
  log "$name: started in the background (log: $logs/$name.log)"
}
await() {
  local name=$1 t0=$SECONDS rc
  [ -n "${job_pid[$name]:-}" ] || { echo "await $name: no such step started" >&2; exit 1; }
  while [ ! -s "$logs/$name.rc" ]; do
    if ! kill -0 "${job_pid[$name]}" 2>/dev/null && [ ! -s "$logs/$name.rc" ]; then
      echo "the set-up step $name ended without an exit status; the end of its log ($logs/$name.log):" >&2
      tail -n 40 "$logs/$name.log" >&2
      exit 1
    fi
    sleep 1
  done
  rc=$(cat "$logs/$name.rc")
  if [ "$rc" != 0 ]; then
    echo "the set-up step $name failed (exit $rc); the end of its log ($logs/$name.log):" >&2
    tail -n 40 "$logs/$name.log" >&2
    exit 1
  fi
  if [ $((SECONDS - t0)) -gt 0 ]; then log "waited $((SECONDS - t0)) s for $name"; fi
}
# On the way out (a failure, ^C): what still runs in the background is stopped, by its
# process group, and the test cluster is stopped if this run started it.
cluster_was_up=false
stop_cluster=false
cleanup() {
  local name
  for name in "${!job_pid[@]}"; do
    if [ ! -s "$logs/$name.rc" ] && kill -0 "${job_pid[$name]}" 2>/dev/null; then
      log "stopping the unfinished step $name"
      kill -- -"${job_pid[$name]}" 2>/dev/null || true
    fi
  done
  if [ "$stop_cluster" = true ]; then
    log "stopping the test cluster"
    bash scripts/k8s/cluster.sh down || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

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

# The test cluster's binaries (scripts/k8s/build.sh: Kubernetes, etcd, kwok, gVisor's runsc
# and its containerd shim) need only Go, and on a fresh machine take the longest of any
# step (10-25 minutes of two cores): they start before the rest. Cached under ~/.cache/roche, they
# cost a second then. (After the trim above, which would pull cache entries from under it.)
job k8s-build bash scripts/k8s/build.sh

# ---------- Debian packages, all in one apt-get run (before any step that needs one) ----------
need=()          # installed with their recommended packages
need_bare=()     # installed without
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
# The microVM providers (provider/vm): QEMU, a Debian guest kernel with its modules,
# mkfs.ext4 for root filesystems (and for the sized filesystems that bound Docker
# sandboxes' writable roots and workspaces), xz to uncompress the kernel, cpio to check
# initramfs.
command -v qemu-system-x86_64 >/dev/null 2>&1 || need_bare+=(qemu-system-x86)
compgen -G '/boot/vmlinuz-*' >/dev/null || need_bare+=(linux-image-amd64)
command -v mkfs.ext4 >/dev/null 2>&1 || need_bare+=(e2fsprogs)
command -v xz >/dev/null 2>&1 || need_bare+=(xz-utils)
command -v cpio >/dev/null 2>&1 || need_bare+=(cpio)
# The oci provider (provider/oci) runs sandboxes with an OCI runtime binary: crun (the
# default where it works; on hybrid cgroup hosts without the cgroup2 mount, see
# docs/providers/oci.md) and runc.
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || need_bare+=(runc)
command -v crun >/dev/null 2>&1 || need_bare+=(crun)
# tmux: the roche shell tests (internal/cli) run it as a real terminal.
command -v tmux >/dev/null 2>&1 || need+=(tmux)
# tcpdump: internal/daemon's TestTLSCaptureShowsNoToken captures roched's port on lo.
command -v tcpdump >/dev/null 2>&1 || need_bare+=(tcpdump)
# chromium: internal/daemon's TestConsoleInABrowser drives roched's console headless
# (with puppeteer-core, installed below once Node is there).
command -v chromium >/dev/null 2>&1 || need_bare+=(chromium)
# jq: scripts/runsc.sh merges the runsc runtime into dockerd's configuration with it.
command -v jq >/dev/null 2>&1 || need_bare+=(jq)
# Python 3.10+ for the Python SDK: its own tests (below) and deploy/kubernetes's Go test,
# which runs it against roched in the test cluster; and, for the offline install tests,
# pip, setuptools and wheel, and venv (the wheel of make dist is installed into a fresh venv).
if ! python3 -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null \
   || ! /usr/bin/python3 -c 'import setuptools, wheel, pip' >/dev/null 2>&1 \
   || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  need+=(python3 python3-pip python3-setuptools python3-wheel python3-venv)
fi
# Node 18+ and npm for the TypeScript SDK (the machine image has Node 20; Debian's
# packages otherwise): its tests below, and the README's TypeScript quick start, which
# internal/quickstart runs offline from npm's cache, filled here from the lockfile.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then need+=(nodejs npm); fi
if [ $((${#need[@]} + ${#need_bare[@]})) -gt 0 ]; then
  log "installing ${need[*]} ${need_bare[*]}"
  apt-get update -qq
  if [ ${#need[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  if [ ${#need_bare[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_bare[@]}" >/dev/null
  fi
fi
# (From here on only the test cluster's start, in its step below, may run apt-get, for
# what scripts/k8s/cluster.sh itself needs: no two apt-get runs at once.)

# The TypeScript SDK's packages; the console's browser test (internal/daemon
# TestConsoleInABrowser) drives Debian's chromium with puppeteer-core, pinned in its
# lockfile (no browser is downloaded); the quick start then installs the SDK into a
# project (npm install ./sdk/typescript), which needs the registry's metadata of its
# dependencies: fetched here, in a copy.
npm_installs() {
  (cd internal/daemon/testdata/console-browser && npm ci --ignore-scripts --no-audit --no-fund)
  local qs
  qs=$(mktemp -d)
  mkdir -p "$qs/sdk" && cp -r sdk/typescript "$qs/sdk/"
  (cd "$qs" && npm install --no-audit --no-fund ./sdk/typescript)
  rm -rf "$qs"
}
# (sdk/typescript's first, awaited before the Go steps below: npm ci replaces
# sdk/typescript/node_modules, and a go command walking ./... meanwhile fails on a
# directory that went.)
job npm-sdk bash -c 'cd sdk/typescript && npm ci --no-audit --no-fund'

# bin/ (roche, roched, roche-agent), which the image, python.wasm, the cluster's agent
# image and the SDK tests use: built once here, so that no two steps write it at once (a
# later make build finds it up to date and writes nothing).
log "make build"
make -s build


if ! timeout 10 docker info >/dev/null 2>&1; then
  log "starting dockerd (log: /var/log/roche-dockerd.log)"
  nohup dockerd >/var/log/roche-dockerd.log 2>&1 &
  for i in $(seq 1 60); do
    timeout 5 docker info >/dev/null 2>&1 && break
    [ "$i" = 60 ] && { echo "dockerd did not answer within 60 s; see /var/log/roche-dockerd.log" >&2; tail -n 20 /var/log/roche-dockerd.log >&2; exit 1; }
    sleep 1
  done
fi

# gVisor's runsc as the Docker runtime "runsc" (provider/docker's TestConformanceRunsc,
# --runtime runsc): installed and merged into /etc/docker/daemon.json, which the running
# dockerd reloads on the SIGHUP the script sends. (Run once dockerd answers, so that the
# SIGHUP reaches it. scripts/k8s/build.sh builds the same runsc; one waits for the other.)
job runsc bash scripts/runsc.sh

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

job image bash scripts/build-test-image.sh roche/python:local

if [ -f scripts/fetch-python-wasm.sh ]; then
  job python-wasm bash scripts/fetch-python-wasm.sh
fi

# E2B's official SDKs, pinned, for internal/e2b's tests (a venv under ~/.cache/roche/e2b
# from PyPI, node_modules from npm's lockfile).
job e2b-sdks bash scripts/e2b-sdks.sh

# The test cluster (CONTRIBUTING.md, "The test cluster") for the Kubernetes tests: a real
# single-node Kubernetes, started once its binaries are built and stopped when the suite
# ends, unless it was already up (then it stays). Its export KUBECONFIG=... line goes to
# $logs/cluster.env.
if bash scripts/k8s/cluster.sh env >/dev/null 2>&1; then cluster_was_up=true; fi
# (After the image's step: up imports roche/python:local into the node, building it when
# missing.)
cluster_up() {
  await k8s-build
  await image
  bash scripts/k8s/cluster.sh up >"$logs/cluster.env"
}
job cluster cluster_up
if [ "$cluster_was_up" = false ]; then stop_cluster=true; fi

await npm-sdk
job npm npm_installs

# Every package a test imports compiled with both cores, while the set-up runs, as the
# tests build them (CGO_ENABLED=0): go vet compiles what it checks against, and links
# nothing. The streams below then do not compile the same dependencies twice, one package
# at a time. (Linking every test binary ahead too, with go test -exec /bin/true, would
# double the links, which go does not cache: the streams link each one again.)
job compile env CGO_ENABLED=0 go vet ./...

# gofmt, go vet, staticcheck, go mod tidy: waited for at the end, so niced (on a fresh
# machine the cluster's build, which the longer stream waits for, goes first).
job vet nice -n 10 make -s vet

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

# ---------- go test: two streams at once ----------
#
# The full tier: every test runs, and one whose need is missing fails (testenv.Needs).
export ROCHE_TEST_TIER=full
# CGO_ENABLED=0, as roche-agent is built: the agent's in-process tests (internal/guest/server)
# test the program that runs in sandboxes, which is static.
# The escape suite (./escape) is among them: it attacks every provider with what this
# script set up (dockerd with runsc, crun and runc, the test cluster, QEMU, python.wasm)
# and fails when docs/escapes.md differs from what it saw.
#
# Within a stream one package runs at a time (-p 1). The two streams share the one Docker
# engine, QEMU and the machine, which tests already allow, since several test runs (other
# checkouts', other packages') use them at once:
#   - every sweep is scoped to its own: roche gc --all and destroy --all take only their
#     owner's sandboxes (internal/cli sets a ROCHE_OWNER of its process's own, the SDK
#     suites' harnesses one per run, internal/daemon's tenants theirs), and the engine-wide
#     --any-owner is only ever --dry-run in tests (internal/cli TestYourOwnOnly); a
#     roched adopts and reaps only sandboxes of its owner, which names its state file
#     (internal/ledger/owner.go), and each test's roched has a state file of its own;
#   - counts of containers are of a tag or owner of the counting test's own
#     (internal/cli's privateImage, internal/daemon's and internal/faults's restart tests
#     tag the image for themselves); provider/vm's tests keep their VMs in a state
#     directory of their own (t.TempDir), and look for leftover processes by it;
#   - the engine is never restarted or frozen: internal/faults and internal/doctor start a
#     private dockerd, in a network namespace of their own, for that;
#   - agent directories under /run/roche/docker are swept only when their container is
#     gone and their maker's flock is free (provider/docker/agentdir.go), so a sweep in
#     one stream never takes a create under way in the other;
#   - what tests listen on is port 0, picked by the kernel (the fixed ports in tests are
#     only parsed, never bound).
# What the streams must not share, they do not: every package whose tests use the test
# cluster runs in the same stream ("cluster"), because those tests import and remove the
# same agent image on the node (provider/kubernetes's TestMain, escape, deploy/kubernetes,
# internal/daemon): a removal in one stream would fail another's Pod start mid-test.
# provider/docker's network test routes 169.254.169.254 on the host into a namespace of
# its own for a while, and escape probes that address from sandboxes: they share a stream
# too. The TypeScript SDK's suite reinstalls sdk/typescript/node_modules (npm ci), which
# internal/quickstart's TypeScript quick start installs from: same stream, after it.
# Each stream's output goes to $logs/stream-NAME.log (go test -json in
# $logs/gotest-*.json, read by scripts/testsummary: a line per package, the output of every
# failed test, skips counted) and is printed when the stream ends; the suite fails if either
# did.
go build -o "$logs/testsummary" ./scripts/testsummary
gotest() {
  local name=$1 t0=$SECONDS
  shift
  log "go test ($name), one package at a time: ${*#"$module"/}"
  CGO_ENABLED=0 go test -p 1 -count=1 -timeout 60m -json "$@" | tee "$logs/gotest-$name.json" | "$logs/testsummary"
  echo "go test $name: $((SECONDS - t0)) s" >>"$logs/times"
}
phase() { # NAME COMMAND...: a step of a stream, timed
  local name=$1 t0=$SECONDS
  shift
  log "$name"
  "$@"
  echo "$name: $((SECONDS - t0)) s" >>"$logs/times"
}

# The packages of each stream: "cluster" those whose tests use the test cluster (they
# import internal/testcluster or need testenv.Cluster), escape and provider/docker;
# "engine" every other one. Each stream's packages in go list's order.
module=$(go list -m)
cluster_pkgs=()
engine_pkgs=()
listing=$(go list -f '{{.ImportPath}} {{.Dir}}' ./...)
while read -r pkg dir; do
  if [ "$pkg" = "$module/provider/docker" ] || [ "$pkg" = "$module/escape" ] ||
     { compgen -G "$dir/*_test.go" >/dev/null && grep -qE 'internal/testcluster"|testenv\.Cluster\b' "$dir"/*_test.go; }; then
    cluster_pkgs+=("$pkg")
  else
    engine_pkgs+=("$pkg")
  fi
done <<<"$listing"
log "stream cluster: ${#cluster_pkgs[@]} packages; stream engine: ${#engine_pkgs[@]} packages"

common_needs() {
  await compile
  await image
  await runsc
  if [ -n "${job_pid[python-wasm]:-}" ]; then await python-wasm; fi
  await npm
  await e2b-sdks
}

# Stream "cluster": provider/docker first (on a fresh machine the cluster's binaries are
# still building then), then the packages on the test cluster. On a fresh machine this is
# the longer way (the cluster's build, then its packages), so the SDK suites are in the
# other stream.
stream_cluster() {
  common_needs
  gotest docker "$module/provider/docker"
  await cluster
  eval "$(cat "$logs/cluster.env")"
  local rest=()
  for p in "${cluster_pkgs[@]}"; do [ "$p" = "$module/provider/docker" ] || rest+=("$p"); done
  gotest cluster "${rest[@]}"
}

# Stream "engine": every other package, then the race detector, fuzzing and the Python
# and TypeScript SDKs' suites.
stream_engine() {
  common_needs
  gotest engine "${engine_pkgs[@]}"
  # The race detector (it needs cgo) over the tests written for it: a provider's Close
  # while lease teardowns still run its OCI runtime.
  phase "go test -race" go test -race -count=1 -run 'TestCloseSealedDuringRuns' ./provider/oci
  # Every fuzz target for a few seconds (their seed corpora ran above as plain tests);
  # make fuzz runs them longer.
  phase "fuzz (scripts/fuzz.sh, 3 s a target)" env FUZZTIME=3s bash scripts/fuzz.sh
  make -s build
  phase "python sdk (sdk/python/tests: the real roched and CLI from bin/, both transports)" \
    python3 -m unittest discover -s sdk/python/tests -t sdk/python/tests -v
  # (npm ci again replaces sdk/typescript/node_modules: once make vet, which walks ./...,
  # is done.)
  await vet
  phase "typescript sdk (sdk/typescript/test: the real roched and CLI from bin/, both transports)" \
    bash -c 'cd sdk/typescript && npm ci --no-audit --no-fund && npm test'
}

declare -A stream_pid=()
for s in cluster engine; do
  set -m
  (
    trap - EXIT
    t0=$SECONDS
    "stream_$s"
    echo "stream $s: $((SECONDS - t0)) s" >>"$logs/times"
  ) >"$logs/stream-$s.log" 2>&1 </dev/null &
  stream_pid[$s]=$!
  job_pid[stream-$s]=$! # stopped with the steps on the way out
  set +m
  log "stream $s: started (log: $logs/stream-$s.log)"
done
# Each stream's output is printed as it ends, the first to end first.
failed=()
while [ ${#stream_pid[@]} -gt 0 ]; do
  rc=0
  done_pid=
  wait -n -p done_pid "${stream_pid[@]}" || rc=$?
  [ -n "$done_pid" ] || { echo "waiting for the test streams failed (exit $rc)" >&2; exit 1; }
  for s in "${!stream_pid[@]}"; do
    [ "${stream_pid[$s]}" = "$done_pid" ] || continue
    unset 'stream_pid[$s]'
    echo "$rc" >"$logs/stream-$s.rc"
    log "stream $s ended (exit $rc); its output ($logs/stream-$s.log):"
    cat "$logs/stream-$s.log"
    log "end of stream $s's output"
    [ "$rc" = 0 ] || failed+=("$s")
  done
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "the test stream(s) ${failed[*]} failed: see their output above" >&2
  exit 1
fi

log "gofmt, go vet, staticcheck, go mod tidy"
await vet
cat "$logs/vet.log"

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
log "what each step took (seconds; the background steps overlap, and so do the streams):"
sort "$logs/times"
log "all tests passed; no sandbox, agent directory, workspace or snapshot left behind"

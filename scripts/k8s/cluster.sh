#!/usr/bin/env bash
# The project's test cluster: one real Kubernetes 1.34 node on this machine, for the
# Kubernetes provider's tests. Needs root.
#
#   scripts/k8s/cluster.sh up [--kwok N]   start it (idempotent), print the env line
#   scripts/k8s/cluster.sh down            stop it and remove what it made
#   scripts/k8s/cluster.sh env             print the env line (exit 1 when not up)
#   scripts/k8s/cluster.sh status          say what runs
#   scripts/k8s/cluster.sh import-docker IMAGE          copy a local Docker image into the node
#   scripts/k8s/cluster.sh import-tar FILE [BASE-NAME]  import a docker-save or OCI archive
#   scripts/k8s/cluster.sh has-image IMAGE              exit 0 when the node has the image
#
# What runs (every process's pid in $STATE/pids, its log in $STATE/logs):
#   etcd v3.6 (127.0.0.1:2379), kube-apiserver (NODE_IP:6443; static tokens, RBAC and the
#   Node authorizer, certificates from a CA made here with openssl), kube-controller-manager
#   and kube-scheduler (no serving ports), a containerd of its own (socket, root and state
#   under this script's directories, never Docker's), and a kubelet registered as node
#   "roche-node" with --node-ip NODE_IP, an address this host already has (the interface of
#   the default route unless ROCHE_CLUSTER_NODE_IP says otherwise). Pods get their network
#   from roche-test-cni (internal/testcluster/cmd/roche-test-cni): the Debian bridge plugin,
#   except that a Pod labelled roche.network=none gets only its loopback interface. Pod
#   traffic is kept on this host: the node forwards nothing from the Pod bridge to another
#   interface. Images come in without a registry (import-docker, import-tar); the sandbox
#   image is roche/pause:local, built here from internal/testcluster/cmd/roche-pause.
#   Roche's seccomp profile is installed in the kubelet's seccomp directory
#   ($STATE/kubelet/seccomp/roche.json), as an operator installs it on every node, since
#   the Kubernetes provider's sandboxes run under it and refuse a node without it. Each
#   up imports roche/python:local and the Kubernetes provider's agent image (that of the
#   roche-agent make build makes from this checkout), so that roche run --provider
#   kubernetes works on it at once.
#
# gVisor: containerd has a second runtime handler, runsc (gVisor's containerd shim and runsc,
# both built by build.sh at the version scripts/runsc.sh pins), and the cluster a
# RuntimeClass gvisor naming it, so --runtime-class gvisor runs a sandbox's Pod in gVisor.
# runsc's flags ($STATE/runsc.toml), as scripts/runsc.sh gives Docker's and for the same
# reasons, except the network: --oci-seccomp (gVisor's kernel enforces the seccomp profile
# each container gets, Roche's), --overlay2=none (what a sandbox writes goes to its
# container's layer, not to gVisor's memory) and --network=sandbox (gVisor's own network
# stack on the Pod's interfaces: a Pod with network has it, one labelled roche.network=none
# has only loopback from the CNI, as under runc). No --host-uds: the agent is reached
# through exec, never a host socket. The handler passes a Pod's dev.gvisor.* annotations
# (pod_annotations) to the shim: gVisor's mount hints, with which the Kubernetes provider
# makes a gVisor Pod's /tmp and /dev/shm tmpfs of gVisor's own kernel, of their size; the
# shim finds the volumes they name under this kubelet's root (build.sh says how).
#
# Volumes: roche-test-provisioner (internal/testcluster/cmd/roche-test-provisioner) runs on
# this host beside the cluster, as root, and serves the StorageClass roche-loop, the
# cluster's default (provisioner roche.test/loop, reclaim Delete, WaitForFirstConsumer): each
# PersistentVolumeClaim gets an ext4 filesystem of exactly its size in a sparse image,
# loop-mounted under $STATE/volumes, as a `local` PersistentVolume on the node, so that a
# Pod writing past the size gets ENOSPC; a reclaimed volume's image and loop device go.
#
# Binaries come from scripts/k8s/build.sh (cached by version under ~/.cache/roche; the first
# build takes 10-25 minutes).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)

STATE=${ROCHE_CLUSTER_DIR:-/var/lib/roche-cluster}
RUN=${ROCHE_CLUSTER_RUN:-/run/roche-cluster}
API_PORT=${ROCHE_CLUSTER_API_PORT:-6443}
ETCD_PORT=${ROCHE_CLUSTER_ETCD_PORT:-2379}
# Kubernetes has no per-container process limit; the kubelet bounds each Pod's (-1: none).
POD_PIDS_LIMIT=${ROCHE_CLUSTER_POD_PIDS_LIMIT:--1}
NODE_NAME=roche-node
POD_SUBNET=10.244.0.0/24
SERVICE_RANGE=10.96.0.0/16
SERVICE_IP=10.96.0.1
BRIDGE=roche-cni0
SOCK=$RUN/containerd.sock
KUBECONFIG_PATH=$STATE/admin.kubeconfig
PAUSE_IMAGE=roche/pause:local
TEST_IMAGE=${ROCHE_CLUSTER_TEST_IMAGE:-roche/python:local}
FWD_CHAIN=ROCHE-CLUSTER-FWD
NAT_CHAIN=ROCHE-CLUSTER-SVC
RUNTIME_CLASS=gvisor
RUNSC_HANDLER=runsc
STORAGE_CLASS=roche-loop
PROVISIONER_NAME=roche.test/loop
VOLUMES=$STATE/volumes

log() { printf 'cluster: %s\n' "$*" >&2; }
die() { printf 'cluster: %s\n' "$*" >&2; exit 1; }

case ${1:-} in
  -h | --help | help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

[ "$(id -u)" = 0 ] || die "needs root (it runs containerd, a kubelet and iptables): run it with sudo"

BIN=${ROCHE_K8S_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/roche/k8s-${K8S_VERSION:-v1.34.4}}
RUNSC_VERSION=${ROCHE_RUNSC_VERSION:-$(sed -n 's/^version=\${ROCHE_RUNSC_VERSION:-\(v[^}]*\)}$/\1/p' "$repo/scripts/runsc.sh")}
GVISOR=${ROCHE_CACHE:-${HOME:-/root}/.cache/roche}/runsc/$RUNSC_VERSION
# containerd finds a shim by its name on its PATH: this directory comes first on it.
SHIM_DIR=$STATE/runsc/bin

# ---------- processes, by recorded pid only ----------

pidfile() { echo "$STATE/pids/$1.pid"; }

# alive NAME: the recorded pid runs the recorded binary (a reused pid does not count).
alive() {
  local f pid exe
  f=$(pidfile "$1")
  [ -f "$f" ] || return 1
  read -r pid exe <"$f" || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ]
}

# start NAME BINARY ARGS...: starts in its own session so that a Ctrl-C in the shell that
# ran make does not reach it, logs to $STATE/logs/NAME.log.
start() {
  local name=$1 binary=$2
  shift 2
  # fd 9 is the start/stop lock: a daemon holding it would hold the lock for its lifetime.
  setsid "$binary" "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null 9>&- &
  echo "$! $(readlink -f "$binary")" >"$(pidfile "$name")"
}

# stop NAME...: signals each recorded pid, then waits for all (10 s, then SIGKILL).
stop() {
  local name f pid exe i pids=() names=()
  for name in "$@"; do
    f=$(pidfile "$name")
    if alive "$name"; then
      read -r pid exe <"$f"
      kill "$pid" 2>/dev/null || true
      pids+=("$pid")
      names+=("$name")
    fi
    rm -f "$f"
  done
  for i in "${!pids[@]}"; do
    pid=${pids[$i]}
    for _ in $(seq 1 100); do
      [ -d "/proc/$pid" ] || break
      sleep 0.1
    done
    if [ -d "/proc/$pid" ]; then
      log "${names[$i]} ($pid) did not stop within 10 s; killing it"
      kill -9 "$pid" 2>/dev/null || true
      sleep 0.2
    fi
    log "stopped ${names[$i]} ($pid) at $(elapsed "$t_start") s"
  done
}

# ---------- addresses, credentials, configuration ----------

node_ip() {
  if [ -n "${ROCHE_CLUSTER_NODE_IP:-}" ]; then echo "$ROCHE_CLUSTER_NODE_IP"; return; fi
  local dev ip
  dev=$(ip -4 route show default 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i+1); exit}}')
  if [ -n "$dev" ]; then
    ip=$(ip -4 -o addr show dev "$dev" scope global | awk '{split($4, a, "/"); print a[1]; exit}')
  fi
  if [ -z "${ip:-}" ]; then
    ip=$(ip -4 -o addr show scope global | awk '$2 !~ /^(docker|br-|veth|roche)/ {split($4, a, "/"); print a[1]; exit}')
  fi
  [ -n "${ip:-}" ] || die "no global IPv4 address on this host for the node; set ROCHE_CLUSTER_NODE_IP to one it has"
  echo "$ip"
}

token() { head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

credentials() {
  local ip=$1 pki=$STATE/pki
  mkdir -p "$pki" "$STATE/tokens"
  chmod 700 "$pki" "$STATE/tokens"
  if [ ! -f "$pki/ca.crt" ]; then
    log "making a CA and service-account keys"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -out "$pki/ca.crt" \
      -days 3650 -subj "/CN=roche-test-cluster-ca" 2>/dev/null
    openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
    # The API server's client certificate for the kubelet's port (logs, exec, port-forward).
    openssl req -newkey rsa:2048 -nodes -keyout "$pki/kubelet-client.key" -out "$pki/kubelet-client.csr" \
      -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >"$pki/client.ext"
    openssl x509 -req -in "$pki/kubelet-client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -out "$pki/kubelet-client.crt" -days 3650 -extfile "$pki/client.ext" 2>/dev/null
  fi
  # The serving certificate names the node address, so a new address gets a new one.
  if [ ! -f "$pki/apiserver.crt" ] || [ "$(cat "$pki/apiserver.ip" 2>/dev/null)" != "$ip" ]; then
    openssl req -newkey rsa:2048 -nodes -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" \
      -subj "/CN=kube-apiserver" 2>/dev/null
    printf 'subjectAltName=IP:%s,IP:127.0.0.1,IP:%s,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n' \
      "$ip" "$SERVICE_IP" >"$pki/apiserver.ext"
    openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
      -out "$pki/apiserver.crt" -days 3650 -extfile "$pki/apiserver.ext" 2>/dev/null
    echo "$ip" >"$pki/apiserver.ip"
  fi
  local who
  for who in admin node controller-manager scheduler; do
    [ -s "$STATE/tokens/$who" ] || token >"$STATE/tokens/$who"
  done
  {
    echo "$(cat "$STATE/tokens/admin"),admin,admin,system:masters"
    echo "$(cat "$STATE/tokens/node"),system:node:$NODE_NAME,node-$NODE_NAME,system:nodes"
    echo "$(cat "$STATE/tokens/controller-manager"),system:kube-controller-manager,kube-controller-manager"
    echo "$(cat "$STATE/tokens/scheduler"),system:kube-scheduler,kube-scheduler"
  } >"$STATE/tokens.csv"
  chmod 600 "$STATE/tokens.csv"
  local ca_data
  ca_data=$(base64 -w0 <"$pki/ca.crt")
  for who in admin node controller-manager scheduler; do
    umask 077
    cat >"$STATE/$who.kubeconfig.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: roche-test
  cluster:
    server: https://$ip:$API_PORT
    certificate-authority-data: $ca_data
users:
- name: $who
  user:
    token: $(cat "$STATE/tokens/$who")
contexts:
- name: roche-test
  context:
    cluster: roche-test
    user: $who
current-context: roche-test
EOF
    mv -f "$STATE/$who.kubeconfig.tmp" "$STATE/$who.kubeconfig"
    umask 022
  done
  # For tests that speak to the API server with the standard library (internal/testcluster).
  cat >"$STATE/cluster.json" <<EOF
{"server": "https://$ip:$API_PORT", "caFile": "$pki/ca.crt", "tokenFile": "$STATE/tokens/admin",
 "kubeconfig": "$KUBECONFIG_PATH", "node": "$NODE_NAME", "nodeIP": "$ip", "containerd": "$SOCK",
 "podSubnet": "$POD_SUBNET"}
EOF
}

containerd_config() {
  cat >"${1:-$STATE/containerd.toml}" <<EOF
# A containerd for the test cluster only: its own socket, root and state, apart from Docker's.
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd-opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/$PAUSE_IMAGE"
  # Without it runc fails on this kernel: "can't get final child's PID from pipe: EOF".
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$RUN/runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$RUNSC_HANDLER]
      runtime_type = "io.containerd.runsc.v1"
      # gVisor's own annotations (its mount hints, dev.gvisor.spec.mount.*) reach the shim.
      pod_annotations = ["dev.gvisor.*"]
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$RUNSC_HANDLER.options]
        TypeUrl = "io.containerd.runsc.v1.options"
        ConfigPath = "$STATE/runsc.toml"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$STATE/cni/bin"
    conf_dir = "$STATE/cni/net.d"
    max_conf_num = 1
EOF
}

# runsc for the runsc handler: the binaries copied from the cache (root's, beside the
# config), its flags in $STATE/runsc.toml (see the top of this file for why each).
runsc_config() {
  local b
  for b in runsc containerd-shim-runsc-v1; do
    [ -x "$GVISOR/$b" ] || die "no $GVISOR/$b: run scripts/k8s/build.sh"
  done
  cmp -s "$GVISOR/runsc" "$SHIM_DIR/runsc" || install -D -m 0755 "$GVISOR/runsc" "$SHIM_DIR/runsc"
  cmp -s "$GVISOR/containerd-shim-runsc-v1" "$SHIM_DIR/containerd-shim-runsc-v1.real" ||
    install -D -m 0755 "$GVISOR/containerd-shim-runsc-v1" "$SHIM_DIR/containerd-shim-runsc-v1.real"
  # containerd 1.6 takes what a shim's start prints for its address; gVisor's shim, built
  # with containerd 2's library, prints the JSON containerd 1.7 and later read
  # ({"version":2,"address":"unix://...","protocol":"ttrpc"}): the shim containerd runs is
  # this, which passes the address on (every other command goes to the shim as it is).
  cat >"$SHIM_DIR/containerd-shim-runsc-v1.tmp" <<'EOF'
#!/bin/sh
real=$(dirname "$0")/containerd-shim-runsc-v1.real
for a in "$@"; do
  if [ "$a" = start ]; then
    out=$("$real" "$@") || exit
    case $out in
      "{"*) printf '%s' "$out" | sed -n 's/.*"address":"\([^"]*\)".*/\1/p' | tr -d '\n' ;;
      *) printf '%s' "$out" ;;
    esac
    exit 0
  fi
done
exec "$real" "$@"
EOF
  chmod 0755 "$SHIM_DIR/containerd-shim-runsc-v1.tmp"
  mv -f "$SHIM_DIR/containerd-shim-runsc-v1.tmp" "$SHIM_DIR/containerd-shim-runsc-v1"
  cat >"$STATE/runsc.toml" <<EOF
# The test cluster's runsc runtime handler (gVisor $RUNSC_VERSION); read by containerd-shim-runsc-v1.
binary_name = "$SHIM_DIR/runsc"
root = "$RUN/runsc-root"
[runsc_config]
  network = "sandbox"
  oci-seccomp = "true"
  overlay2 = "none"
EOF
}

# The RuntimeClass naming the runsc handler (every up: etcd starts empty), with the memory
# gVisor's own kernel and gofer take in each Pod as its overhead (podFixed, added to the
# Pod's cgroup, in which the shim runs them, beside the containers' limits): about 40 MiB
# at rest, so a sandbox's programs and tmpfs mounts get their whole memory limit. A class
# made before it had one gets it (a merge patch).
RUNTIME_OVERHEAD_MEMORY=64Mi
runtime_class() {
  local code body
  body="{\"apiVersion\": \"node.k8s.io/v1\", \"kind\": \"RuntimeClass\", \"metadata\": {\"name\": \"$RUNTIME_CLASS\"}, \"handler\": \"$RUNSC_HANDLER\", \"overhead\": {\"podFixed\": {\"memory\": \"$RUNTIME_OVERHEAD_MEMORY\"}}}"
  code=$(api -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' "$(api_server)/apis/node.k8s.io/v1/runtimeclasses" -d "$body") || true
  if [ "$code" = 409 ]; then
    code=$(api -o /dev/null -w '%{http_code}' -X PATCH -H 'Content-Type: application/merge-patch+json' "$(api_server)/apis/node.k8s.io/v1/runtimeclasses/$RUNTIME_CLASS" \
      -d "{\"overhead\": {\"podFixed\": {\"memory\": \"$RUNTIME_OVERHEAD_MEMORY\"}}}") || true
  fi
  case $code in
    200 | 201) ;;
    *) die "making the RuntimeClass $RUNTIME_CLASS failed (HTTP $code)" ;;
  esac
}

# The default StorageClass, served by roche-test-provisioner (every up: etcd starts empty).
storage_class() {
  local code
  code=$(api -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' "$(api_server)/apis/storage.k8s.io/v1/storageclasses" \
    -d "{\"apiVersion\": \"storage.k8s.io/v1\", \"kind\": \"StorageClass\", \"metadata\": {\"name\": \"$STORAGE_CLASS\", \"annotations\": {\"storageclass.kubernetes.io/is-default-class\": \"true\"}}, \"provisioner\": \"$PROVISIONER_NAME\", \"reclaimPolicy\": \"Delete\", \"volumeBindingMode\": \"WaitForFirstConsumer\"}") || true
  case $code in
    201 | 409) ;;
    *) die "making the StorageClass $STORAGE_CLASS failed (HTTP $code)" ;;
  esac
}

# The volume provisioner, started when it is not running or runs an older build (build.sh
# links the current one); its StorageClass made. It loop-mounts, so it runs here as root,
# not in a Pod (no image could be pulled for one).
provisioner_up() {
  local want pid exe
  want=$(readlink -f "$BIN/roche-test-provisioner")
  [ -x "$want" ] || die "no $BIN/roche-test-provisioner: run scripts/k8s/build.sh"
  if alive roche-test-provisioner; then
    read -r pid exe <"$(pidfile roche-test-provisioner)"
    if [ "$exe" != "$want" ]; then
      log "restarting roche-test-provisioner ($pid) on its new build"
      stop roche-test-provisioner
    fi
  fi
  if ! alive roche-test-provisioner; then
    mkdir -p "$VOLUMES"
    start roche-test-provisioner "$want" --kubeconfig "$KUBECONFIG_PATH" --dir "$VOLUMES" --node "$NODE_NAME" --name "$PROVISIONER_NAME"
  fi
  storage_class
}

# volumes_clean unmounts and removes every volume the provisioner made (their claims went
# with etcd), which releases their loop devices.
volumes_clean() {
  [ -d "$VOLUMES" ] || return 0
  local m
  findmnt -rn -o TARGET | awk -v v="$VOLUMES/" 'index($0, v) == 1' | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
  rm -rf "$VOLUMES"
}

# A cluster started before the runsc handler existed (or with other runsc flags) gets the
# new containerd configuration: containerd alone restarts (its shims, and so the Pods, keep
# running; the kubelet reconnects).
containerd_refresh() {
  runsc_config
  containerd_config "$STATE/containerd.toml.new"
  if cmp -s "$STATE/containerd.toml.new" "$STATE/containerd.toml" && [ "$(cat "$STATE/containerd.path" 2>/dev/null)" = "$SHIM_DIR" ]; then
    rm -f "$STATE/containerd.toml.new"
    return 0
  fi
  mv -f "$STATE/containerd.toml.new" "$STATE/containerd.toml"
  log "restarting containerd for its new configuration (runtime handler $RUNSC_HANDLER)"
  stop containerd
  start_containerd
  wait_for containerd 30 containerd_ready || fail_with_log "containerd did not answer within 30 s" containerd
}

start_containerd() {
  PATH=$SHIM_DIR:$PATH start containerd "$(command -v containerd)" --config "$STATE/containerd.toml"
  echo "$SHIM_DIR" >"$STATE/containerd.path"
}

cni_config() {
  local ip=$1
  mkdir -p "$STATE/cni/bin" "$STATE/cni/net.d" "$STATE/cni/ipam"
  local p
  for p in /usr/lib/cni/*; do ln -sfn "$p" "$STATE/cni/bin/$(basename "$p")"; done
  install -m 755 "$STATE/bin/roche-test-cni" "$STATE/cni/bin/roche-test-cni"
  cat >"$STATE/cni/net.d/10-roche-test.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "roche-test",
  "plugins": [{
    "type": "roche-test-cni",
    "capabilities": {"portMappings": true},
    "apiServer": "https://$ip:$API_PORT",
    "tokenFile": "$STATE/tokens/node",
    "caFile": "$STATE/pki/ca.crt",
    "offLabel": "roche.network",
    "offValue": "none",
    "delegates": [
      {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
       "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]], "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": "$STATE/cni/ipam"}},
      {"type": "portmap", "capabilities": {"portMappings": true}}
    ]
  }]
}
EOF
}

kubelet_config() {
  local ip=$1
  cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
# This host is on cgroup v1; 1.34 still runs there when told to.
failCgroupV1: false
failSwapOn: false
# Pod-level cgroups, as on a real node: podPidsLimit bounds a Pod's processes there.
cgroupsPerQOS: true
cgroupRoot: /
enforceNodeAllocatable: []
podPidsLimit: $POD_PIDS_LIMIT
containerRuntimeEndpoint: unix://$SOCK
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: AlwaysAllow}
serializeImagePulls: false
resolvConf: /etc/resolv.conf
# A shared development machine: no node-pressure eviction, and no image garbage collection
# (imported images cannot be pulled again).
evictionHard: {}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: $STATE/pod-logs
staticPodPath: ""
rotateCertificates: false
EOF
}

# ---------- firewall: Pods stay on this host; the kubernetes Service reaches the API server ----------

firewall_up() {
  local ip=$1
  iptables -N "$FWD_CHAIN" 2>/dev/null || iptables -F "$FWD_CHAIN"
  # Pod to Pod on the bridge is allowed; nothing from the Pod bridge is forwarded elsewhere,
  # so Pods with network reach this host and each other, never another machine.
  iptables -A "$FWD_CHAIN" -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT
  iptables -A "$FWD_CHAIN" -i "$BRIDGE" -j DROP
  iptables -A "$FWD_CHAIN" -o "$BRIDGE" -j DROP
  iptables -C FORWARD -j "$FWD_CHAIN" 2>/dev/null || iptables -I FORWARD 1 -j "$FWD_CHAIN"
  # No kube-proxy: the one Service Pods need, "kubernetes", is a DNAT to the API server.
  iptables -t nat -N "$NAT_CHAIN" 2>/dev/null || iptables -t nat -F "$NAT_CHAIN"
  iptables -t nat -A "$NAT_CHAIN" -s "$POD_SUBNET" -d "$SERVICE_IP/32" -p tcp --dport 443 -j DNAT --to-destination "$ip:$API_PORT"
  iptables -t nat -C PREROUTING -j "$NAT_CHAIN" 2>/dev/null || iptables -t nat -I PREROUTING 1 -j "$NAT_CHAIN"
}

firewall_down() {
  while iptables -D FORWARD -j "$FWD_CHAIN" 2>/dev/null; do :; done
  iptables -F "$FWD_CHAIN" 2>/dev/null || true
  iptables -X "$FWD_CHAIN" 2>/dev/null || true
  while iptables -t nat -D PREROUTING -j "$NAT_CHAIN" 2>/dev/null; do :; done
  iptables -t nat -F "$NAT_CHAIN" 2>/dev/null || true
  iptables -t nat -X "$NAT_CHAIN" 2>/dev/null || true
}

# ---------- images ----------

ctr_k8s() { ctr -a "$SOCK" -n k8s.io "$@"; }

have_image() { ctr_k8s images ls -q 2>/dev/null | grep -qx "docker.io/$1"; }

import_docker() {
  local image=$1
  containerd_up_or_die
  docker image inspect "$image" >/dev/null 2>&1 || die "no Docker image $image on this host (docker images); build or load it first"
  log "importing $image from Docker"
  docker save "$image" | ctr_k8s images import - >/dev/null
}

import_tar() {
  local file=$1 name=${2:-}
  containerd_up_or_die
  [ -f "$file" ] || die "no file $file: give a docker-save or OCI archive"
  if [ -n "$name" ]; then
    ctr_k8s images import --base-name "$name" "$file"
  else
    ctr_k8s images import "$file"
  fi
}

containerd_up_or_die() {
  ctr -a "$SOCK" version >/dev/null 2>&1 || die "the test cluster's containerd is not running: run make cluster first"
}

pause_image() {
  have_image "$PAUSE_IMAGE" && return 0
  local ctx=$STATE/pause-image
  mkdir -p "$ctx"
  cp "$STATE/bin/roche-pause" "$ctx/pause"
  printf 'FROM scratch\nCOPY pause /pause\nUSER 65535:65535\nENTRYPOINT ["/pause"]\n' >"$ctx/Dockerfile"
  log "building $PAUSE_IMAGE"
  docker build -q -t "$PAUSE_IMAGE" "$ctx" >"$STATE/logs/pause-build.log" 2>&1 || fail_with_log "building $PAUSE_IMAGE failed" pause-build
  import_docker "$PAUSE_IMAGE"
}

# The test image is imported again when Docker's copy changed (rebuilt) since the last import.
test_image() {
  if ! docker image inspect "$TEST_IMAGE" >/dev/null 2>&1; then
    bash "$repo/scripts/build-test-image.sh" "$TEST_IMAGE"
  fi
  local id mark
  id=$(docker image inspect -f '{{.Id}}' "$TEST_IMAGE")
  mark=$STATE/containerd-images/$(echo "$TEST_IMAGE" | tr '/:' '__').id
  if have_image "$TEST_IMAGE" && [ "$(cat "$mark" 2>/dev/null)" = "$id" ]; then return 0; fi
  import_docker "$TEST_IMAGE"
  mkdir -p "$(dirname "$mark")"
  echo "$id" >"$mark"
}

# ---------- Roche's seccomp profile ----------

# The profile is written by roche built from this checkout (roche kubernetes
# seccomp-profile, as docs/providers/kubernetes.md tells operators), again when what it is
# made from changed since the last install (the profile, or how it is resolved).
seccomp_profile() {
  local dir=$STATE/kubelet/seccomp mark
  mark=$(cat "$repo/provider/internal/seccomp/seccomp.json" "$repo/provider/internal/seccomp/filter_linux.go" "$repo/provider/kubernetes/seccomp_linux.go" | sha256sum | cut -c1-32)
  if [ -f "$dir/roche.json" ] && [ "$(cat "$STATE/seccomp.mark" 2>/dev/null)" = "$mark" ]; then return 0; fi
  log "installing Roche's seccomp profile on the node"
  # The thin roche hands the command to roched beside it, the full binary.
  (cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$STATE/bin/" ./cmd/roche ./cmd/roched)
  mkdir -p "$dir"
  "$STATE/bin/roche" kubernetes seccomp-profile --output "$dir/roche.json.tmp"
  mv -f "$dir/roche.json.tmp" "$dir/roche.json"
  echo "$mark" >"$STATE/seccomp.mark"
}

# The Kubernetes provider's agent image, roche/agent:<digest of roche-agent>: in no
# registry (its Pods never pull it), so imported here, so that the provider works on the
# cluster as soon as it is up. Built as make build builds bin/ (the same flags make the
# same binary, so the same image as bin/roche-agent's), into $STATE; again whenever the
# agent changed (a new digest).
agent_image() {
  local bin=$STATE/bin/agent tar=$STATE/roche-agent.tar ref
  (cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$bin/" ./cmd/roche ./cmd/roched ./cmd/roche-agent)
  ref=$("$bin/roche" kubernetes agent-image --output "$tar")
  if ! have_image "$ref"; then
    log "importing the agent image $ref"
    ctr_k8s images import "$tar" >/dev/null
  fi
  rm -f "$tar"
}

# ---------- state ----------

api() {
  curl -sS --max-time 5 --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $(cat "$STATE/tokens/admin")" "$@"
}

api_server() { echo "https://$(cat "$STATE/pki/apiserver.ip"):$API_PORT"; }

node_ready() {
  api "$(api_server)/api/v1/nodes/$NODE_NAME" 2>/dev/null | tr -d ' \n' | grep -q '"type":"Ready","status":"True"'
}

components=(etcd kube-apiserver containerd kube-controller-manager kube-scheduler kubelet)

is_up() {
  local c
  for c in "${components[@]}"; do alive "$c" || return 1; done
  [ "$(api "$(api_server)/readyz" 2>/dev/null)" = ok ] && node_ready
}

env_line() { echo "export KUBECONFIG=$KUBECONFIG_PATH"; }

wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for i in $(seq 1 $((secs * 4))); do
    if "$@"; then return 0; fi
    sleep 0.25
  done
  return 1
}

apiserver_ready() { [ "$(api "$(api_server)/readyz" 2>/dev/null)" = ok ]; }
containerd_ready() { ctr -a "$SOCK" version >/dev/null 2>&1; }

fail_with_log() {
  log "$1; the end of $STATE/logs/$2.log:"
  tail -n 25 "$STATE/logs/$2.log" >&2 || true
  exit 1
}

install_missing() {
  local need=()
  command -v containerd >/dev/null 2>&1 || need+=(containerd)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  command -v docker >/dev/null 2>&1 || need+=(docker.io)
  command -v openssl >/dev/null 2>&1 || need+=(openssl)
  command -v curl >/dev/null 2>&1 || need+=(curl)
  command -v iptables >/dev/null 2>&1 || need+=(iptables)
  if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
}

up() {
  local kwok_nodes=0
  while [ $# -gt 0 ]; do
    case $1 in
      --kwok) [ $# -ge 2 ] || die "--kwok needs a number of fake nodes"; kwok_nodes=$2; shift 2 ;;
      *) die "unknown option $1 (usage: cluster.sh up [--kwok N])" ;;
    esac
  done
  case $kwok_nodes in *[!0-9]*) die "--kwok wants a number of nodes, not $kwok_nodes" ;; esac
  mkdir -p "$STATE/pids" "$STATE/logs" "$STATE/bin"
  if [ -f "$STATE/pki/apiserver.ip" ] && is_up; then
    ROCHE_KUBELET_PODS_DIR=$STATE/kubelet/pods bash "$here/build.sh" >/dev/null
    containerd_refresh
    runtime_class
    provisioner_up
    seccomp_profile
    if [ "$kwok_nodes" -gt 0 ]; then kwok_up "$kwok_nodes"; fi
    agent_image
    env_line
    return 0
  fi
  # A partly running cluster (a component died, the machine rebooted) starts over.
  local c
  for c in "${components[@]}" roche-test-provisioner kwok; do
    if alive "$c"; then
      log "a previous start is partly up; stopping it first"
      down
      mkdir -p "$STATE/pids" "$STATE/logs" "$STATE/bin"
      break
    fi
  done

  local t0 ip
  t0=$(date +%s.%N)
  install_missing
  ROCHE_KUBELET_PODS_DIR=$STATE/kubelet/pods bash "$here/build.sh" >/dev/null
  log "building roche-test-cni and roche-pause"
  (cd "$repo" && CGO_ENABLED=0 go build -trimpath -o "$STATE/bin/" ./internal/testcluster/cmd/roche-test-cni ./internal/testcluster/cmd/roche-pause)
  ip=$(node_ip)
  ip -4 -o addr show | awk '{split($4, a, "/"); print a[1]}' | grep -qx "$ip" || die "$ip is not an address of this host; set ROCHE_CLUSTER_NODE_IP to one it has"
  credentials "$ip"
  runsc_config
  containerd_config
  cni_config "$ip"
  kubelet_config "$ip"
  mkdir -p "$RUN" "$STATE/kubelet" "$STATE/pod-logs"
  rm -f "$STATE/seccomp.mark"
  seccomp_profile

  # A fresh cluster every start: no Pod of an earlier run comes back, nor a volume.
  rm -rf "$STATE/etcd"
  volumes_clean
  log "starting etcd, kube-apiserver and containerd (node $NODE_NAME at $ip)"
  start etcd "$BIN/etcd" --name default --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "default=http://127.0.0.1:$((ETCD_PORT + 1))" --unsafe-no-fsync=true
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$ip" --advertise-address "$ip" --secure-port "$API_PORT" \
    --tls-cert-file "$STATE/pki/apiserver.crt" --tls-private-key-file "$STATE/pki/apiserver.key" \
    --client-ca-file "$STATE/pki/ca.crt" --token-auth-file "$STATE/tokens.csv" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$STATE/pki/sa.pub" --service-account-signing-key-file "$STATE/pki/sa.key" \
    --service-cluster-ip-range "$SERVICE_RANGE" \
    --kubelet-client-certificate "$STATE/pki/kubelet-client.crt" --kubelet-client-key "$STATE/pki/kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --profiling=false
  start_containerd

  wait_for containerd 30 containerd_ready || fail_with_log "containerd did not answer within 30 s" containerd
  pause_image
  test_image
  agent_image
  wait_for kube-apiserver 60 apiserver_ready || fail_with_log "kube-apiserver was not ready within 60 s" kube-apiserver
  log "kube-apiserver ready after $(elapsed "$t0") s; starting the controller-manager, scheduler and kubelet"

  runtime_class
  firewall_up "$ip"
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$STATE/controller-manager.kubeconfig" --secure-port 0 --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$STATE/pki/sa.key" --root-ca-file "$STATE/pki/ca.crt" \
    --cluster-signing-cert-file "$STATE/pki/ca.crt" --cluster-signing-key-file "$STATE/pki/ca.key" \
    --allocate-node-cidrs=false --profiling=false
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$STATE/scheduler.kubeconfig" --secure-port 0 --leader-elect=false --profiling=false
  start kubelet "$BIN/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/node.kubeconfig" \
    --root-dir "$STATE/kubelet" --cert-dir "$STATE/kubelet/pki" --volume-plugin-dir "$STATE/kubelet-plugins" \
    --hostname-override "$NODE_NAME" --node-ip "$ip"

  wait_for node 60 node_ready || fail_with_log "node $NODE_NAME was not Ready within 60 s" kubelet
  provisioner_up
  for c in "${components[@]}" roche-test-provisioner; do alive "$c" || fail_with_log "$c exited during start-up" "$c"; done
  if [ "$kwok_nodes" -gt 0 ]; then kwok_up "$kwok_nodes"; fi
  log "cluster up in $(elapsed "$t0") s (logs: $STATE/logs)"
  env_line
}

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }

# ---------- kwok: fake nodes for scale tests ----------

kwok_up() {
  local n=$1 stages mod i
  if ! alive kwok; then
    mod=$(go env GOMODCACHE)/sigs.k8s.io/kwok@${KWOK_VERSION:-v0.8.0}/kustomize/stage
    [ -d "$mod" ] || go mod download "sigs.k8s.io/kwok@${KWOK_VERSION:-v0.8.0}" >/dev/null
    stages=$STATE/kwok-stages.yaml
    {
      for f in "$mod"/node/fast/*.yaml "$mod"/node/heartbeat-with-lease/*.yaml "$mod"/pod/fast/*.yaml; do
        case $f in *kustomization.yaml) continue ;; esac
        echo "---"
        cat "$f"
      done
    } >"$stages"
    start kwok "$BIN/kwok" --kubeconfig "$KUBECONFIG_PATH" --config "$stages" --manage-all-nodes=false \
      --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake --node-lease-duration-seconds 40
  fi
  for i in $(seq 1 "$n"); do
    api -o /dev/null -w '' -X POST -H 'Content-Type: application/json' "$(api_server)/api/v1/nodes" -d @- <<EOF || true
{"apiVersion": "v1", "kind": "Node",
 "metadata": {"name": "kwok-node-$i", "annotations": {"kwok.x-k8s.io/node": "fake"},
              "labels": {"type": "kwok", "kubernetes.io/hostname": "kwok-node-$i"}},
 "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]},
 "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "1000"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "1000"}}}
EOF
  done
  log "kwok runs $n fake node(s) kwok-node-1..$n (tainted kwok.x-k8s.io/node=fake:NoSchedule)"
}

# ---------- down ----------

cri_clean() {
  [ -x "$BIN/cri-clean" ] || { log "no $BIN/cri-clean; run scripts/k8s/build.sh"; return 1; }
  "$BIN/cri-clean" "unix://$SOCK" >&2
}

down() {
  local t0
  t0=$(date +%s.%N)
  mkdir -p "$STATE/pids" "$STATE/logs"
  # The kubelet first, so it does not restart what is removed next.
  stop kwok roche-test-provisioner kubelet
  # Pods: the runtime stops each sandbox (the CNI plugin's DEL, the network namespace) and
  # removes it, after which its shim exits. A containerd that is not running but left
  # sandboxes behind is started once more for this.
  if [ -d "$RUN/containerd/io.containerd.runtime.v2.task/k8s.io" ] && [ -n "$(ls -A "$RUN/containerd/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null)" ] && ! alive containerd; then
    log "starting containerd again to remove the Pods it left"
    start_containerd
    wait_for containerd 30 containerd_ready || true
  fi
  if alive containerd; then
    cri_clean || log "some Pods were not removed cleanly (see above)"
  fi
  stop kube-scheduler kube-controller-manager kube-apiserver
  stop etcd containerd
  # A shim whose task could not be deleted: its pid is in the task's bundle.
  local f pid
  for f in "$RUN"/containerd/io.containerd.runtime.v2.task/k8s.io/*/shim.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if [ -n "$pid" ] && [ -d "/proc/$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$SOCK"; then
      log "stopping leftover shim $pid"
      kill "$pid" 2>/dev/null || true
    fi
  done
  # Mounts the kubelet and containerd made (volumes, rootfs, shm), deepest first.
  local m
  findmnt -rn -o TARGET | awk -v s="$STATE/" -v r="$RUN/" 'index($0, s) == 1 || index($0, r) == 1' | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
  volumes_clean
  if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
  # The kubelet's Pod cgroups (and runc's, had Pods no Pod cgroup); rmdir takes only empty ones.
  find /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/k8s.io -depth -type d -exec rmdir {} \; 2>/dev/null || true
  firewall_down
  rm -rf "$STATE/etcd" "$STATE/kubelet" "$STATE/pod-logs" "$STATE/cni/ipam" "$RUN"
  # Paths the kubelet and libcni use whatever their configuration says: the kubelet's device
  # plugin socket and checkpoint, the container log links, the CNI result cache; the
  # directories go only if nothing else is in them.
  rm -f /var/lib/kubelet/device-plugins/kubelet.sock /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint
  rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet /var/log/containers /var/lib/cni/results /var/lib/cni 2>/dev/null || true
  rm -f "$STATE"/pids/*.pid
  log "down in $(elapsed "$t0") s"
}

status() {
  local c
  for c in "${components[@]}" roche-test-provisioner kwok; do
    if alive "$c"; then echo "$c: running (pid $(awk '{print $1}' "$(pidfile "$c")"))"; else echo "$c: stopped"; fi
  done
  if [ -f "$STATE/pki/apiserver.ip" ] && is_up; then echo "cluster: up"; env_line; else echo "cluster: not up"; return 1; fi
}

# One start or stop at a time: tests of several packages (or helpers) may call up together.
lock() {
  mkdir -p "$STATE"
  exec 9>"$STATE/cluster.lock"
  flock -w 300 9 || die "another cluster.sh has held $STATE/cluster.lock for 5 minutes"
}

t_start=$(date +%s.%N)
cmd=${1:-up}
[ $# -gt 0 ] && shift
case $cmd in
  up | down) lock ;;
esac
case $cmd in
  up) up "$@" ;;
  down) down ;;
  env) [ -f "$STATE/pki/apiserver.ip" ] && is_up || die "the test cluster is not up: run make cluster"; env_line ;;
  status) status ;;
  import-docker) [ $# -eq 1 ] || die "usage: cluster.sh import-docker IMAGE"; import_docker "$1" ;;
  import-tar) [ $# -ge 1 ] && [ $# -le 2 ] || die "usage: cluster.sh import-tar FILE [BASE-NAME]"; import_tar "$@" ;;
  has-image) [ $# -eq 1 ] || die "usage: cluster.sh has-image IMAGE"; containerd_up_or_die; have_image "$1" ;;
  *) die "unknown command $cmd (up, down, env, status, import-docker IMAGE, import-tar FILE)" ;;
esac

#!/usr/bin/env bash
# Installs E2B's official SDKs at the versions internal/e2b's tests pin, the newest and the
# oldest of the tested range (docs/e2b.md), and prints where:
#   python: a venv under ~/.cache/roche/e2b per requirements file, named by its hash
#           (internal/e2b/testdata/requirements.txt, the newest; requirements-oldest.txt)
#   node:   the newest in internal/e2b/testdata/node/node_modules (npm ci, from its
#           package-lock.json); the oldest under ~/.cache/roche/e2b, named by the hash of
#           testdata/node-oldest/package-lock.json, with testdata/node's scripts copied in
# Idempotent: a venv or node_modules already matching is kept. Prints
#   E2B_PYTHON=/path/to/venv/bin/python
#   E2B_PYTHON_OLDEST=/path/to/venv/bin/python
#   E2B_NODE_DIR=/path/to/testdata/node
#   E2B_NODE_OLDEST_DIR=/path/to/cache/node-HASH
set -euo pipefail
cd "$(dirname "$0")/.."
data=internal/e2b/testdata
cache="${ROCHE_CACHE:-$HOME/.cache/roche}/e2b"
mkdir -p "$cache"

# venv REQUIREMENTS: the python of a venv with them installed.
venv() {
  local req=$1 hash dir
  hash=$(sha256sum "$req" | cut -c1-16)
  dir="$cache/venv-$hash"
  if [ ! -x "$dir/bin/python" ] || [ ! -f "$dir/.done" ]; then
    rm -rf "$dir"
    python3 -m venv "$dir" >&2
    "$dir/bin/pip" install -q --disable-pip-version-check -r "$req" >&2
    touch "$dir/.done"
  fi
  echo "$dir/bin/python"
}
echo "E2B_PYTHON=$(venv "$data/requirements.txt")"
echo "E2B_PYTHON_OLDEST=$(venv "$data/requirements-oldest.txt")"

node=$data/node
stamp="$node/node_modules/.lock-$(sha256sum "$node/package-lock.json" | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  (cd "$node" && npm ci --no-audit --no-fund >&2)
  touch "$stamp"
fi
echo "E2B_NODE_DIR=$(cd "$node" && pwd)"

old="$cache/node-$(sha256sum "$data/node-oldest/package-lock.json" | cut -c1-16)"
if [ ! -f "$old/.done" ]; then
  rm -rf "$old"
  mkdir -p "$old"
  cp "$data/node-oldest/package.json" "$data/node-oldest/package-lock.json" "$old/"
  (cd "$old" && npm ci --no-audit --no-fund >&2)
  touch "$old/.done"
fi
cp "$node"/*.js "$old/" # the same scripts, resolving the oldest SDKs from $old/node_modules
echo "E2B_NODE_OLDEST_DIR=$old"

#!/usr/bin/env bash
# Installs E2B's official SDKs at the versions internal/e2b's tests pin, and prints where:
#   python: a venv under ~/.cache/roche/e2b, named by the hash of
#           internal/e2b/testdata/requirements.txt (pip, from PyPI)
#   node:   internal/e2b/testdata/node/node_modules (npm ci, from package-lock.json)
# Idempotent: a venv or node_modules already matching is kept. Prints
#   E2B_PYTHON=/path/to/venv/bin/python
#   E2B_NODE_DIR=/path/to/testdata/node
set -euo pipefail
cd "$(dirname "$0")/.."
req=internal/e2b/testdata/requirements.txt
cache="${ROCHE_CACHE:-$HOME/.cache/roche}/e2b"
hash=$(sha256sum "$req" | cut -c1-16)
venv="$cache/venv-$hash"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.done" ]; then
  rm -rf "$venv"
  mkdir -p "$cache"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >&2
  touch "$venv/.done"
fi
echo "E2B_PYTHON=$venv/bin/python"
node=internal/e2b/testdata/node
if [ -f "$node/package-lock.json" ]; then
  stamp="$node/node_modules/.lock-$(sha256sum "$node/package-lock.json" | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    (cd "$node" && npm ci --no-audit --no-fund >&2)
    touch "$stamp"
  fi
  echo "E2B_NODE_DIR=$(cd "$node" && pwd)"
fi

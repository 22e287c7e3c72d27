#!/usr/bin/env bash
# The main job: a sandboxed hello. Builds roche, then runs
#   roche run -- python3 -c "print('hello')"
# in Docker when an engine answers and the local image exists, and otherwise on the
# zero-dependency WASM provider (fetching python.wasm with npm the first time).
#
#   make hello        (or: bash scripts/hello.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

make -s build

if timeout 5 docker image inspect roche/python:local >/dev/null 2>&1; then
  echo "provider: docker (image roche/python:local)" >&2
  exec ./bin/roche run --provider docker --image roche/python:local -- python3 -c "print('hello')"
fi
echo "provider: wasm (no Docker engine with roche/python:local here)" >&2
bash scripts/fetch-python-wasm.sh >&2
exec ./bin/roche run --provider wasm -- python3 -c "print('hello')"

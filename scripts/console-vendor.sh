#!/usr/bin/env bash
# Copies the console's front-end libraries, as internal/console/package-lock.json pins
# them, into internal/console/web/vendor/, which roched embeds. Run after changing a
# version in internal/console/package.json (then npm install --package-lock-only there);
# nothing runs it at build or run time.
set -euo pipefail
cd "$(dirname "$0")/../internal/console"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp package.json package-lock.json "$tmp/"
(cd "$tmp" && npm ci --ignore-scripts --no-audit --no-fund >/dev/null)
x="$tmp/node_modules/@xterm/xterm"
cp "$x/lib/xterm.js" web/vendor/xterm.js
cp "$x/css/xterm.css" web/vendor/xterm.css
cp "$x/LICENSE" web/vendor/xterm.LICENSE
echo "vendored @xterm/xterm $(node -p "require('$x/package.json').version")"

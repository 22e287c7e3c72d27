#!/usr/bin/env bash
# The fast tier: gofmt, go vet, staticcheck and go mod tidy (make vet), then every test
# that needs nothing but Go (no root, Docker engine, cluster, QEMU or python.wasm), with
# the race detector. As any user, on a fresh clone; it installs nothing. The tests that
# need more skip in this tier, saying what in one line (internal/testenv.Needs), and the
# last lines count them by what they need; make test runs them all.
#
#   make check        (or: bash scripts/check.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== gofmt, go vet, staticcheck, go mod tidy"
make -s vet

# -race needs cgo, which needs a C compiler; make check installs nothing, so without one
# the tests run without the race detector, and say so.
race=-race
cc=$(go env CC)
if ! command -v "${cc%% *}" >/dev/null 2>&1; then
  echo "== no C compiler ($cc) for the race detector: the tests run without -race (apt-get install gcc adds it)"
  race=
fi

echo "== go test $race (ROCHE_TEST_TIER=fast)"
go build -o "${TMPDIR:-/tmp}/roche-testsummary.$$" ./scripts/testsummary
trap 'rm -f "${TMPDIR:-/tmp}/roche-testsummary.$$"' EXIT
ROCHE_TEST_TIER=fast go test $race -count=1 -json -timeout 10m ./... | "${TMPDIR:-/tmp}/roche-testsummary.$$"

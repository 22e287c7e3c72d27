#!/usr/bin/env bash
# Runs every Go fuzz target (each func FuzzXxx in a *_fuzz_test.go) for FUZZTIME, one
# after the other (go test fuzzes one target per run) with one worker, so that it shares
# a small machine: make test runs each for a few seconds, make fuzz for longer. None needs
# root, an engine or a cluster. Their seed corpora (f.Add, testdata/fuzz/FuzzXxx) run as
# plain tests in every go test.
#
#   bash scripts/fuzz.sh                      # each target for FUZZTIME (default 3s)
#   FUZZTIME=5m FUZZ=Extract bash scripts/fuzz.sh   # targets whose name matches FUZZ, 5 min each
#
# A failing input is written to the package's testdata/fuzz/FuzzXxx/ (keep it there once
# fixed: it then runs in every go test); the script goes on with the other targets and
# fails at the end, naming them.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${FUZZTIME:-3s}
pattern=${FUZZ:-.}
# Minimizing each new input found may take this long; the default, 60 s, would let a
# bounded run go far past its time.
minimize=${FUZZMINIMIZETIME:-5s}

targets=()
while IFS= read -r line; do
  file=${line%%:*}
  name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]+).*/\1/' <<<"${line#*:}")
  [[ $name =~ $pattern ]] || continue
  dir=$(dirname "$file")
  targets+=("$([ "$dir" = . ] && echo . || echo "./$dir") $name")
done < <(git ls-files -co --exclude-standard '*_fuzz_test.go' | sort | xargs grep -H -E '^func Fuzz[A-Za-z0-9_]+\(f \*testing\.F\)')

if [ ${#targets[@]} -eq 0 ]; then
  echo "no fuzz target matches FUZZ=$pattern" >&2
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
start=$SECONDS
for t in "${targets[@]}"; do
  read -r pkg name <<<"$t"
  t0=$SECONDS
  status=0
  CGO_ENABLED=0 go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" \
    -parallel 1 "$pkg" >"$log" 2>&1 || status=$?
  # Go 1.26's coordinator can fail a target with a bare "context deadline exceeded" as
  # -fuzztime ends, having found nothing (go.dev/issue/75804, fixed in Go 1.27): that is
  # no finding. A finding always writes its input.
  if [ $status -ne 0 ] && grep -qx '    context deadline exceeded' "$log" && ! grep -q 'Failing input written' "$log"; then
    status=0
  fi
  if [ $status -eq 0 ]; then
    # The last progress line: inputs run, or, when the time went on re-running the
    # corpus kept from earlier runs, how much of it.
    done=$(grep -oE 'execs: [0-9]+|baseline coverage: [0-9]+/[0-9]+' "$log" | tail -n 1 || true)
    printf '%-24s %-22s %s, %ds\n' "$name" "$pkg" "${done:-?}" $((SECONDS - t0))
  else
    printf '%-24s %-22s FAILED\n' "$name" "$pkg"
    cat "$log"
    failed+=("$name ($pkg)")
  fi
done
echo "fuzzed ${#targets[@]} targets for $fuzztime each in $((SECONDS - start)) s"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'fuzzing found failures in: %s\n' "${failed[*]}" >&2
  exit 1
fi

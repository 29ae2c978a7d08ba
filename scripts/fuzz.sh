#!/usr/bin/env bash
# Runs every Go fuzz target in the module, one at a time (go test -fuzz takes one target per
# run). The open-protocol decoder gets FUZZTIME, every other target FUZZTIME_OTHERS.
#   scripts/fuzz.sh                    FUZZTIME=60s, others 10s
#   FUZZTIME=10m FUZZTIME_OTHERS=2m scripts/fuzz.sh
#
# Go before 1.27 can fail a fuzz run that found nothing with a bare "context deadline
# exceeded" when -fuzztime expires (a race in the fuzz coordinator, go.dev/issue/75804),
# most often on a loaded machine. A run that fails that way, with no failing input written
# and no other failure, is run once more; a crash always fails (Go writes the input to
# testdata/fuzz/<target>/ and says so).
set -euo pipefail
cd "$(dirname "$0")/.."
main_time="${FUZZTIME:-60s}"
other_time="${FUZZTIME_OTHERS:-10s}"
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# coordinator_race FILE: the run's output shows only go.dev/issue/75804.
coordinator_race() {
  ! grep -q 'Failing input written to' "$1" &&
    grep -A1 -- '^--- FAIL: Fuzz' "$1" | tail -n1 | grep -q '^    context deadline exceeded$' &&
    [[ $(grep -c -- '^--- FAIL' "$1") -eq 1 ]]
}

status=0
while IFS=: read -r file name; do
  pkg="./$(dirname "$file")"
  t=$other_time
  [[ $pkg == ./cdc/open && $name == FuzzDecode ]] && t=$main_time
  for attempt in 1 2; do
    echo "fuzz $pkg $name for $t"
    if go test -run='^$' -fuzz="^${name}\$" -fuzztime="$t" "$pkg" 2>&1 | tee "$out"; [[ ${PIPESTATUS[0]} -eq 0 ]]; then
      break
    fi
    if [[ $attempt -eq 1 ]] && coordinator_race "$out"; then
      echo "fuzz $pkg $name: failed with only \"context deadline exceeded\" and no failing input (go.dev/issue/75804); running it again"
      continue
    fi
    status=1
    break
  done
done < <(git ls-files '*_test.go' | xargs grep -Ho '^func Fuzz[A-Za-z0-9_]*' | sed 's/func //' | sort)
exit $status

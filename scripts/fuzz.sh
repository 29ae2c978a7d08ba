#!/usr/bin/env bash
# Runs every Go fuzz target in the module, one at a time (go test -fuzz takes one target per
# run). The open-protocol decoder gets FUZZTIME, every other target FUZZTIME_OTHERS.
#   scripts/fuzz.sh                    FUZZTIME=60s, others 10s
#   FUZZTIME=10m FUZZTIME_OTHERS=2m scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
main_time="${FUZZTIME:-60s}"
other_time="${FUZZTIME_OTHERS:-10s}"
status=0
while IFS=: read -r file name; do
  pkg="./$(dirname "$file")"
  t=$other_time
  [[ $pkg == ./cdc/open && $name == FuzzDecode ]] && t=$main_time
  echo "fuzz $pkg $name for $t"
  if ! go test -run='^$' -fuzz="^${name}\$" -fuzztime="$t" "$pkg"; then
    status=1
  fi
done < <(git ls-files '*_test.go' | xargs grep -Ho '^func Fuzz[A-Za-z0-9_]*' | sed 's/func //' | sort)
exit $status

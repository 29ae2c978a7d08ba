#!/usr/bin/env bash
# Builds the Prometheus server and promtool (Prometheus 3.x, pinned by the Go module in
# scripts/prometheus) with -tags remove_all_sd (no cloud service discovery: static
# targets are all the tests scrape), and caches them keyed by the hash of
# scripts/prometheus/go.sum, so a warm machine never rebuilds them. Prints the directory
# holding both binaries on stdout. The observability tests (dashboards and alert rules
# against a live daemon) find them through PARITY_PROMETHEUS_DIR, which scripts/env up
# writes to var/env.sh.
#
# Cache location: $PARITY_CACHE (default ~/.cache/parity).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${PARITY_CACHE:-$HOME/.cache/parity}"
key="$(sha256sum "$here/prometheus/go.sum" | cut -c1-16)"
dir="$cache/prometheus-$key"
if [[ -x "$dir/prometheus" && -x "$dir/promtool" ]]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$cache/prometheus-build"
# One build at a time: a second caller waits for the first and then finds the binaries.
exec 9>"$cache/prometheus-build/lock"
flock 9
if [[ -x "$dir/prometheus" && -x "$dir/promtool" ]]; then
  echo "$dir"
  exit 0
fi
log="$cache/prometheus-build/build-$key.log"
echo "building prometheus and promtool (cold build takes 3-8 minutes; log: $log)" >&2
mkdir -p "$dir.tmp"
(
  cd "$here/prometheus"
  export GOFLAGS="-modcacherw -buildvcs=false -mod=mod"
  for cmd in prometheus promtool; do
    go build -tags remove_all_sd -o "$dir.tmp/$cmd" "github.com/prometheus/prometheus/cmd/$cmd"
  done
) >"$log" 2>&1 || { echo "prometheus build failed; last lines of $log:" >&2; tail -30 "$log" >&2; exit 1; }
rm -rf "$dir"
mv "$dir.tmp" "$dir"
echo "$dir"

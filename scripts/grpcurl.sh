#!/usr/bin/env bash
# Builds grpcurl (the version pinned by the Go module in scripts/grpcurl, from the Go
# module proxy) and caches it keyed by the hash of scripts/grpcurl/go.mod and go.sum, so
# a warm machine never rebuilds it. The runbook's end-to-end test
# (cmd/parity/runbook_e2e_test.go) calls it to drive the daemon's API by reflection.
#
#   scripts/grpcurl.sh --path      build if needed, print the binary's path
#   scripts/grpcurl.sh ARGS...     build if needed, run grpcurl ARGS...
#
# Cache location: $PARITY_CACHE (default ~/.cache/parity). A cold build takes 1-3 minutes.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${PARITY_CACHE:-$HOME/.cache/parity}"
key="$(cat "$here/grpcurl/go.mod" "$here/grpcurl/go.sum" | sha256sum | cut -c1-16)"
bin="$cache/grpcurl-$key/grpcurl"
if [[ ! -x $bin ]]; then
  mkdir -p "$cache/grpcurl-build"
  # One build at a time: a second caller waits for the first and then finds the binary.
  exec 9>"$cache/grpcurl-build/lock"
  flock 9
  if [[ ! -x $bin ]]; then
    log="$cache/grpcurl-build/build-$key.log"
    echo "building grpcurl (log: $log)" >&2
    mkdir -p "$(dirname "$bin")"
    (
      cd "$here/grpcurl"
      export GOFLAGS="-modcacherw -buildvcs=false -mod=mod"
      ver="$(awk '$1 == "github.com/fullstorydev/grpcurl" {print $2}' go.mod)"
      go build -ldflags "-X main.version=$ver" -o "$bin.tmp" github.com/fullstorydev/grpcurl/cmd/grpcurl
    ) >"$log" 2>&1 || { echo "grpcurl build failed; last lines of $log:" >&2; tail -30 "$log" >&2; exit 1; }
    mv "$bin.tmp" "$bin"
  fi
  exec 9>&-
fi
if [[ ${1:-} == --path ]]; then
  echo "$bin"
  exit 0
fi
exec "$bin" "$@"

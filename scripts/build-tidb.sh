#!/usr/bin/env bash
# Builds tidb-server (embedded unistore) from the pinned Go module in scripts/tidb and
# caches the binary keyed by the hash of scripts/tidb/go.sum, so a warm machine never
# rebuilds it. Prints the path of the cached binary on stdout.
#
# Cache location: $PARITY_CACHE (default ~/.cache/parity). The binary is ~250 MiB; the
# module and build caches it needs are ~4 GB and live beside it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${PARITY_CACHE:-$HOME/.cache/parity}"
key="$(sha256sum "$here/tidb/go.sum" | cut -c1-16)"
bin="$cache/tidb-server-$key"
if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$cache/tidb-build"
# One build at a time: a second caller waits for the first and then finds the binary.
exec 9>"$cache/tidb-build/lock"
flock 9
if [[ -x "$bin" ]]; then
  echo "$bin"
  exit 0
fi
log="$cache/tidb-build/build-$key.log"
echo "building tidb-server (cold build takes 5-10 minutes; log: $log)" >&2
(
  cd "$here/tidb"
  export GOMODCACHE="$cache/tidb-build/modcache" GOCACHE="$cache/tidb-build/gocache"
  export GOFLAGS="-modcacherw -buildvcs=false" GOTOOLCHAIN=go1.25.8
  go build -o "$bin.tmp" \
    -ldflags "-X github.com/pingcap/tidb/pkg/parser/mysql.TiDBReleaseVersion=v8.5.6 \
              -X github.com/pingcap/tidb/pkg/util/versioninfo.TiDBGitHash=ae18096e023780bb56bfce33698abec0d4640d0a \
              -X github.com/pingcap/tidb/pkg/util/versioninfo.TiDBEdition=Community" \
    github.com/pingcap/tidb/cmd/tidb-server
) >"$log" 2>&1 || { echo "tidb-server build failed; last lines of $log:" >&2; tail -30 "$log" >&2; exit 1; }
mv "$bin.tmp" "$bin"
echo "$bin"

#!/usr/bin/env bash
# Builds tidb-server (embedded unistore) from the pinned Go module in scripts/tidb and
# caches the binary keyed by the hash of scripts/tidb/go.sum and of the patches in
# scripts/tidb/patches, so a warm machine never rebuilds it. Prints the path of the cached
# binary on stdout.
#
# Patches: each scripts/tidb/patches/*.patch names its module in a first line
# `# module: PATH` and is applied (patch -p1) to a copy of that dependency, at the version
# scripts/tidb/go.mod requires, taken from the module cache, and the build uses the copy through
# a `replace` in a scratch copy of scripts/tidb (the module itself is never edited). Today:
# badger-point-get-version.patch — unistore's storage engine answered a point read at an
# old version with the key's newest version once the key had left the memtable and the
# sstable's hash index fell back (github.com/pingcap/badger, table/sstable/table.go,
# Table.Get); real TiKV is not this engine. internal/testenv's
# TestTiDBOldPointReads proves the fix against the running server.
#
# Cache location: $PARITY_CACHE (default ~/.cache/parity). The binary is ~250 MiB; the
# module and build caches it needs are ~4 GB and live beside it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${PARITY_CACHE:-$HOME/.cache/parity}"
key="$(cat "$here/tidb/go.sum" "$here"/tidb/patches/*.patch | sha256sum | cut -c1-16)"
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
  export GOMODCACHE="$cache/tidb-build/modcache" GOCACHE="$cache/tidb-build/gocache"
  export GOFLAGS="-modcacherw -buildvcs=false" GOTOOLCHAIN=go1.25.8
  work="$cache/tidb-build/src-$key"
  rm -rf "$work" && mkdir -p "$work" && cp "$here/tidb/go.mod" "$here/tidb/go.sum" "$work/"
  cd "$work"
  for p in "$here"/tidb/patches/*.patch; do
    mod="$(sed -n '1s/^# module: //p' "$p")"; name="$(basename "$p" .patch)"
    [[ -n "$mod" ]] || { echo "patch $p: its first line must be '# module: PATH'" >&2; exit 1; }
    dir="$(go mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -d "$dir" ]] || { echo "patch $p: module $mod not in the module cache" >&2; exit 1; }
    rm -rf "patched/$name" && mkdir -p patched && cp -r "$dir" "patched/$name" && chmod -R u+w "patched/$name"
    patch -p1 -d "patched/$name" <"$p" || { echo "patch $p does not apply to $mod" >&2; exit 1; }
    go mod edit -replace "$mod=./patched/$name"
  done
  go build -o "$bin.tmp" \
    -ldflags "-X github.com/pingcap/tidb/pkg/parser/mysql.TiDBReleaseVersion=v8.5.6 \
              -X github.com/pingcap/tidb/pkg/util/versioninfo.TiDBGitHash=ae18096e023780bb56bfce33698abec0d4640d0a \
              -X github.com/pingcap/tidb/pkg/util/versioninfo.TiDBEdition=Community" \
    github.com/pingcap/tidb/cmd/tidb-server
  cd / && rm -rf "$work"
) >"$log" 2>&1 || { echo "tidb-server build failed; last lines of $log:" >&2; tail -30 "$log" >&2; exit 1; }
mv "$bin.tmp" "$bin"
echo "$bin"

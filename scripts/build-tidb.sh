#!/usr/bin/env bash
# Builds tidb-server (embedded unistore) from the pinned Go module in scripts/tidb and
# caches the binary keyed by the hash of scripts/tidb/go.sum and of the patches in
# scripts/tidb/patches, so a warm machine never rebuilds it. Prints the path of the cached
# binary on stdout.
#
# Patches: each scripts/tidb/patches/*.patch names its module in a first line
# `# module: PATH` and is applied (patch -p1, in name order) to one copy of that dependency
# per module, at the version scripts/tidb/go.mod requires, taken from the module cache, and
# the build uses the copy through a `replace` in a scratch copy of scripts/tidb (the module
# itself is never edited). Today two patches of unistore's storage engine
# (github.com/pingcap/badger; real TiKV is not this engine), both about reads at an old
# version once a key has left the memtable:
# - badger-point-get-version.patch: a point read got the key's newest version when the
#   sstable's hash index fell back (table/sstable/table.go, Table.Get);
# - badger-compaction-old-versions.patch: a compaction lost the old versions of the first
#   key with old versions in every table it built after its first (table/sstable/builder.go,
#   resetBuffers dropped the old block's leading byte, so that key's old-version offset was 0,
#   which means none): any read of it at an old version, point or scan, found nothing.
# internal/testenv's TestTiDBOldPointReads proves both against the running server.
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
    mod="$(sed -n '1s/^# module: //p' "$p")"; name="$(echo "$mod" | tr / _)"
    [[ -n "$mod" ]] || { echo "patch $p: its first line must be '# module: PATH'" >&2; exit 1; }
    if [[ ! -d "patched/$name" ]]; then # the module's first patch: copy it and use the copy
      dir="$(go mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
      [[ -d "$dir" ]] || { echo "patch $p: module $mod not in the module cache" >&2; exit 1; }
      mkdir -p patched && cp -r "$dir" "patched/$name" && chmod -R u+w "patched/$name"
      go mod edit -replace "$mod=./patched/$name"
    fi
    patch -p1 -d "patched/$name" <"$p" || { echo "patch $p does not apply to $mod" >&2; exit 1; }
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

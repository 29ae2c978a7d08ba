#!/usr/bin/env bash
# Regenerates the protobuf Go code under api/ from api/**/*.proto with Debian's protoc
# (package protobuf-compiler) and the generators pinned in scripts/protoc/go.mod.
#
#   scripts/protoc/generate.sh           write the generated files in place
#   scripts/protoc/generate.sh --check   regenerate into a temporary tree and fail when
#                                        a committed file differs (CI: `make check-generated`)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

if ! command -v protoc >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q protobuf-compiler >/dev/null
  else
    echo "protoc not found: apt-get install protobuf-compiler" >&2; exit 1
  fi
fi
# The well-known types (google/protobuf/*.proto) come with Debian's libprotobuf-dev,
# which protobuf-compiler pulls in.
include=/usr/include
[[ -f $include/google/protobuf/duration.proto ]] || { echo "google/protobuf/duration.proto not under $include" >&2; exit 1; }

bin="$(mktemp -d)"; out="$(mktemp -d)"
trap 'rm -rf "$bin" "$out"' EXIT
(cd scripts/protoc && go build -o "$bin/" google.golang.org/protobuf/cmd/protoc-gen-go google.golang.org/grpc/cmd/protoc-gen-go-grpc)

mapfile -t protos < <(cd api && find . -name '*.proto' | sed 's#^\./##' | sort)
PATH="$bin:$PATH" protoc -I api -I "$include" \
  --go_out="$out" --go_opt=paths=source_relative \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  "${protos[@]}"

if [[ ${1:-} == --check ]]; then
  stale=0
  while IFS= read -r f; do
    if ! cmp -s "$out/$f" "api/$f"; then echo "stale generated file: api/$f (run make generate)" >&2; stale=1; fi
  done < <(cd "$out" && find . -name '*.go' | sed 's#^\./##' | sort)
  while IFS= read -r f; do
    [[ -f $out/$f ]] || { echo "generated file without its .proto: api/$f" >&2; stale=1; }
  done < <(cd api && find . -name '*.pb.go' | sed 's#^\./##' | sort)
  [[ $stale == 0 ]] && echo "generated code is current (${#protos[@]} proto files)"
  exit $stale
fi
cp -r "$out"/. api/
echo "generated $(cd "$out" && find . -name '*.go' | wc -l) files from ${#protos[@]} proto files"

#!/usr/bin/env bash
# ab.sh — the benches that a refactoring must leave within noise, run on two checkouts in
# interleaved order (A B B A …), so that the machine's load falls on both alike.
#
#   scripts/bench/ab.sh DIR_A DIR_B [ROUNDS]     (ROUNDS pairs, default 2)
#
# DIR_A and DIR_B are checkouts (git worktree add DIR REV) that share this environment
# (var/env.sh of the checkout running the script). Each arm runs, shortened so that a pair
# takes ~15 minutes: the open-protocol decoder, the routing key, the applier's
# insert-heavy and update-heavy throughput (PARITY_BENCH_ROWS rows, one pair each, serve
# CPU per million rows), the pause per snapshot pair, freshness under continuous
# verification, and diffbench's TiDB pair without reladiff (parity diff of 1,000,000 rows,
# the bare loop, the cdc-scoped diff of 100,000 dirty keys). The lines each arm prints are
# collected in var/bench/ab/<arm>-<round>.txt and the figures side by side at the end.
set -euo pipefail

a=${1:?usage: ab.sh DIR_A DIR_B [ROUNDS]}
b=${2:?usage: ab.sh DIR_A DIR_B [ROUNDS]}
rounds=${3:-2}
here=$(cd "$(dirname "$0")/../.." && pwd)
out=$here/var/bench/ab
mkdir -p "$out"
set -a
# shellcheck disable=SC1091
. "$here/var/env.sh"
set +a
export PARITY_BENCH_ROWS=${PARITY_BENCH_ROWS:-300000} PARITY_BENCH_PAIRS=1
export PARITY_BENCH_LAG_SECONDS=${PARITY_BENCH_LAG_SECONDS:-20} PARITY_BENCH_FRESHNESS_SECONDS=${PARITY_BENCH_FRESHNESS_SECONDS:-60}

arm() { # arm NAME DIR ROUND
	local name=$1 dir=$2 f=$out/$1-$3.txt
	echo "== $name ($dir, round $3) $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$f"
	(
		cd "$dir"
		go build -o "$out/parity-$name" ./cmd/parity
		go test -run='^$' -bench='^BenchmarkDecode$' -benchtime=2s -benchmem ./cdc/open/ 2>&1 | grep -E '^Benchmark'
		go test -run='^$' -bench='^BenchmarkRouteKey$' -benchtime=500000x ./cdc/ 2>&1 | grep -E '^Benchmark'
		go test -run='^$' -bench='^BenchmarkApplier(Insert|Update)$' -benchtime=1x -timeout=30m ./cdc/e2e/ 2>&1 | grep -E '^Benchmark'
		go test -run='^$' -bench='^BenchmarkVerify(Pause|Freshness)$' -benchtime=1x -timeout=15m ./cmd/parity/ 2>&1 | grep -E '^Benchmark'
		# One harness for both arms (this checkout's diffbench, bare loop included), each
		# arm's parity binary; parity_meta anew, as an older binary refuses a newer schema.
		cd "$here"
		go run ./scripts/bench/diffbench -fresh-meta -parity "$out/parity-$name" -pairs tidb -no-reladiff -hashes=false -bounds=false \
			-work "$out/diff-$name" 2>&1 | sed -n '/== diff benchmark/,$p'
	) 2>&1 | tee -a "$f"
}

for ((r = 1; r <= rounds; r++)); do
	if ((r % 2)); then
		arm A "$a" "$r"
		arm B "$b" "$r"
	else
		arm B "$b" "$r"
		arm A "$a" "$r"
	fi
done
echo "== side by side (A = $a, B = $b)"
for ((r = 1; r <= rounds; r++)); do
	for arm in A B; do
		echo "-- $arm, round $r"
		grep -E '^Benchmark|parity|bare loop|dirty' "$out/$arm-$r.txt" | grep -v '^==' || true
	done
done

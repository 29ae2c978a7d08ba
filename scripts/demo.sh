#!/usr/bin/env bash
# make demo: parity serve replicating a live changefeed into the fallback MariaDB.
#
# Expects the environment of `scripts/env up` (the Makefile runs it first) and bin/parity
# (built if missing). It
#   1. runs `parity loadgen` (standing in for TiDB + TiCDC): sysbench tables, an all-types
#      table and a keyless table on TiDB, imported into the fallback at one TSO, then a
#      live insert/update/delete workload published to a fresh Kafka topic;
#   2. starts `parity serve` after a backlog has built up and prints its status every
#      second: the applied checkpoint's lag shrinks as it catches up;
#   3. when the workload ends, waits until the fallback reflects TiDB at the final
#      resolved ts, compares both sides with `parity diff` at that TSO, and stops
#      everything it started.
# Files: var/demo/ (config, logs). Re-running starts over (the demo database is reset).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ ! -f var/env.sh ]]; then
  echo "demo: var/env.sh is missing; run scripts/env up (make demo does)" >&2
  exit 1
fi
# shellcheck disable=SC1091
. var/env.sh
bin="$root/bin/parity"
if [[ ! -x $bin ]]; then
  go build -o "$bin" ./cmd/parity
fi

run=$(date +%s)
topic="parity-demo-$run"
db="parity_demo"
dir="$root/var/demo"
status_addr="127.0.0.1:$((18390 + ${PARITY_PORT_OFFSET:-0}))"
api_addr="127.0.0.1:$((18490 + ${PARITY_PORT_OFFSET:-0}))"
duration="${DEMO_DURATION:-40s}"
rate="${DEMO_RATE:-300}"
import_rows="${DEMO_IMPORT_ROWS:-20000}"
mkdir -p "$dir"
rm -f "$dir/import_ts" "$dir/loadgen.out"


lg_pid="" serve_pid=""
cleanup() {
  local pid
  for pid in $serve_pid $lg_pid; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '\n== %s\n' "$*"; }

say "loadgen: $import_rows rows per sysbench table imported into the fallback, then ~$rate transactions/s for $duration (topic $topic, 3 partitions)"
"$bin" loadgen \
  --upstream-dsn "$PARITY_TEST_UPSTREAM_DSN" --downstream-dsn "$PARITY_TEST_DOWNSTREAM_DSN" \
  --brokers "$PARITY_TEST_KAFKA" --topic "$topic" --partitions 3 \
  --database "$db" --reset --tables 4 --import-rows "$import_rows" --import-ts-file "$dir/import_ts" \
  --dispatcher table --rate "$rate" --duration "$duration" --resolved-interval 1s \
  --log-level warn >"$dir/loadgen.out" 2>"$dir/loadgen.log" &
lg_pid=$!

until [[ -s $dir/import_ts ]]; do
  if ! kill -0 "$lg_pid" 2>/dev/null; then
    echo "demo: loadgen stopped before the import finished:" >&2
    cat "$dir/loadgen.log" >&2
    exit 1
  fi
  sleep 0.5
done
echo "import done at TSO $(cat "$dir/import_ts"); the changefeed starts there"
cat >"$dir/parity.toml" <<TOML
[changefeed]
id = "demo-$run"
brokers = ["$PARITY_TEST_KAFKA"]
topics = ["$topic"]
time-zone = "+00:00"
# the changefeed starts at the import TSO, like a TiCDC changefeed created with --start-ts
start-ts = $(cat "$dir/import_ts")

[downstream]
dsn = "$PARITY_TEST_DOWNSTREAM_DSN"

[applier]
meta-schema = "parity_demo_meta"
spill-dir = "$dir/spill"

[log]
level = "warn"

[status]
addr = "$status_addr"

[api]
addr = "$api_addr"
TOML

backlog="${DEMO_BACKLOG_SECONDS:-15}"
say "the workload runs; parity serve is not running yet, so a backlog builds up for ${backlog}s"
sleep "$backlog"

say "parity serve --config var/demo/parity.toml (metrics on $status_addr, API on $api_addr)"
"$bin" serve --config "$dir/parity.toml" >"$dir/serve.log" 2>&1 &
serve_pid=$!

# field NAME: a number from `parity status --json` (protojson: one field per line, 64-bit
# integers quoted; no jq needed).
field() { sed -n "s/^ *\"$1\": *\"\{0,1\}\([-0-9.e+]*\).*/\1/p" <<<"$status" | head -1; }
kafka_lag() { sed -n 's/^ *"lag": *"\{0,1\}\([0-9]*\).*/\1/p' <<<"$status" | awk '{s+=$1} END {print s+0}'; }

final=""
n=0
printf '%-15s %-20s %-14s %-14s %-13s %s\n' time applied_ts applied_lag resolved_lag rows_applied kafka_lag_records
while true; do
  # Every 0.25s while it catches up, then every second.
  if ((n < 12)); then sleep 0.25; else sleep 1; fi
  n=$((n + 1))
  if ! kill -0 "$serve_pid" 2>/dev/null; then
    echo "demo: parity serve exited:" >&2
    tail -20 "$dir/serve.log" >&2
    exit 1
  fi
  status=$("$bin" status --addr "$api_addr" --json 2>/dev/null) || continue
  applied=$(field appliedTs)
  printf '%-15s %-20s %-14s %-14s %-13s %s\n' "$(date +%T.%3N)" "$applied" \
    "$(printf '%.2fs' "$(field appliedLagSeconds)")" "$(printf '%.2fs' "$(field resolvedLagSeconds)")" \
    "$(field rowsApplied)" "$(kafka_lag)"
  if [[ -z $final ]] && ! kill -0 "$lg_pid" 2>/dev/null; then
    wait "$lg_pid" || { echo "demo: loadgen failed:" >&2; cat "$dir/loadgen.log" >&2; exit 1; }
    final=$(sed -n 's/^resolved_ts=//p' "$dir/loadgen.out")
    echo "-- workload finished: $(grep '^transactions=' "$dir/loadgen.out"); final resolved ts $final"
  fi
  if [[ -n $final && -n $applied && $applied -ge $final ]]; then
    break
  fi
done

say "caught up: the fallback reflects TiDB at TSO $final"
echo "parity diff --snapshot $final --table '$db.*'"
if "$bin" diff --upstream "$PARITY_TEST_UPSTREAM_DSN" --downstream "$PARITY_TEST_DOWNSTREAM_DSN" \
  --snapshot "$final" --table "$db.*" --output "$dir/diff" >"$dir/diff.out" 2>&1; then
  tail -5 "$dir/diff.out"
  echo "equal: every table of $db matches TiDB at TSO $final"
else
  tail -20 "$dir/diff.out"
  echo "demo: parity diff did not report equality (see var/demo/diff.out)" >&2
fi

say "stopping parity serve (SIGTERM drains and exits)"
kill -TERM "$serve_pid"
wait "$serve_pid" || true
serve_pid=""
echo "done; logs and config in var/demo/"

#!/usr/bin/env bash
# make demo: the product tour. A story for a first-time user, told by running parity
# against the real environment of `scripts/env up` (the Makefile starts it first):
#
#   1. the environment: TiDB, Kafka and the fallback MariaDB;
#   2. `parity loadgen` stands in for the application + TiCDC: tables imported into the
#      fallback at one TSO, then a live workload on TiDB published to Kafka;
#   3. `parity serve` starts behind a backlog and catches up (a live status line: lag,
#      freshness);
#   4. a `full` verification at snapshot pairs while the load goes on, and its report;
#   5. the first database's load ends and a second one starts (created through the
#      changefeed), so rows of the first are never touched again;
#   6. an UPDATE, a DELETE and an INSERT written straight into the fallback are found by
#      a full run with their kind and class, repaired, and a full run is clean;
#   7. writes stop, `parity wait-applied --now`, `parity cutover-check --now` passes;
#   8. where the dashboards, alert rules and metrics are and how to load them.
#
# It is also a smoke test: every step checks its result and the script exits non-zero,
# naming the step, when one is wrong. It stops what it started (parity serve, loadgen) on
# exit and on Ctrl-C; the environment keeps running. Files: var/demo/ (config, logs,
# reports). Re-running starts over (the demo's databases and meta schema are reset).
#
# Knobs: DEMO_IMPORT_ROWS (rows per table imported, 20000), DEMO_RATE (transactions/s,
# 300), DEMO_BACKLOG_SECONDS (load before parity serve starts, 15), DEMO_PROTOCOL (the
# changefeed's protocol, loadgen's --protocol and serve's changefeed.protocol:
# open-protocol, canal-json or simple; make demo PROTOCOL=canal-json sets it).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
if [[ ! -f var/env.sh ]]; then
  echo "demo: var/env.sh is missing; run scripts/env up (make demo does)" >&2
  exit 1
fi
# shellcheck disable=SC1091
. var/env.sh
if [[ ! -x bin/parity ]]; then
  go build -o bin/parity ./cmd/parity
fi
export PATH="$root/bin:$PATH" # the commands shown are the commands run

started=$SECONDS
run=$(date +%s)
topic="parity-demo-$run"
db="parity_demo"     # imported, then loaded while parity catches up
db2="parity_demo_live" # created through the changefeed later, loaded to the end
db3="parity_demo_ticks" # the changefeed's heartbeat once writes stop
meta="parity_demo_meta"
dir="$root/var/demo"
reports="$dir/reports"
status_addr="127.0.0.1:$((18390 + ${PARITY_PORT_OFFSET:-0}))"
export PARITY_API_ADDR="127.0.0.1:$((18490 + ${PARITY_PORT_OFFSET:-0}))"
rate="${DEMO_RATE:-300}"
import_rows="${DEMO_IMPORT_ROWS:-20000}"
backlog="${DEMO_BACKLOG_SECONDS:-15}"
protocol="${DEMO_PROTOCOL:-open-protocol}"
case "$protocol" in
  open-protocol | canal-json | simple) ;;
  *) echo "demo: DEMO_PROTOCOL (make demo PROTOCOL=…) is $protocol; want open-protocol, canal-json or simple" >&2; exit 2 ;;
esac
rm -rf "$dir"
mkdir -p "$dir" "$reports"

tty=false
[[ -t 1 ]] && tty=true
if $tty; then
  B=$'\e[1m' D=$'\e[2m' G=$'\e[32m' R=$'\e[31m' N=$'\e[0m'
else
  B="" D="" G="" R="" N=""
fi

# parity serve and the loads run in sessions of their own (setsid), so a Ctrl-C reaches
# only this script, which stops them in order: the daemon first, then the loads.
lg_pid="" lg2_pid="" lg3_pid="" serve_pid=""
stop_pid() { # stop_pid PID: SIGTERM and wait (a loadgen publishes its final resolved ts)
  if [[ -n $1 ]] && kill -0 "$1" 2>/dev/null; then
    kill -TERM "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
  fi
}
cleanup() {
  local rc=$?
  $tty && printf '\r\e[K'
  stop_pid "$serve_pid"
  stop_pid "$lg3_pid"
  stop_pid "$lg2_pid"
  stop_pid "$lg_pid"
  if ((rc == 130)); then
    printf 'demo: stopped parity serve and the loads it started; the environment keeps running\n' >&2
  elif ((rc != 0)); then
    printf '\n%sdemo: FAILED (exit %d) after %ds; logs and config in var/demo/%s\n' "$R" "$rc" $((SECONDS - started)) "$N" >&2
  fi
}
trap cleanup EXIT
interrupted() {
  trap - INT TERM
  echo
  echo "demo: interrupted" >&2
  exit 130
}
trap interrupted INT TERM
# A Ctrl-C that kills a command inside $(…) can leave bash's own trap unrun (the subshell
# exits 130 instead of dying of SIGINT), so the helpers check for it: signalled() is true
# when an exit status says SIGINT or SIGTERM killed the command.
signalled() { (($1 == 130 || $1 == 143)); }

# chapter N TITLE WHY...: a heading and what the user is about to see, and why it matters.
chapter() {
  local n=$1 title=$2
  shift 2
  local head="$n. $title " rule="" i # titles are ASCII: their length in any locale
  for ((i = ${#head}; i < 85; i++)); do rule+="─"; done
  printf '\n%s── %s%s%s\n' "$B" "$head" "$rule" "$N"
  local line
  for line in "$@"; do printf '   %s\n' "$line"; done
  echo
}
note() { printf '%s   %s%s\n' "$D" "$*" "$N"; }
ok() { printf '%s✔ %s%s\n' "$G" "$*" "$N"; }
fail() {
  printf '%s✘ demo: %s%s\n' "$R" "$*" "$N" >&2
  exit 1
}
shown() { printf '%s$ %s%s\n' "$B" "$*" "$N"; }
indent() { sed 's/^/  /'; }
# clip: lines cut at 118 characters (fix SQL's rows are long); the full text is in steps.log.
clip() { awk '{ if (length($0) > 118) print substr($0, 1, 117) "…"; else print }'; }

# step WANT CMD...: show CMD, run it, print its output indented (up to 40 lines) and
# fail unless it exits WANT. The output is kept in $out (and in var/demo/steps.log).
out=""
step() {
  local want=$1 rc=0
  shift
  shown "$*"
  out=$("$@" 2>&1) || rc=$?
  printf '$ %s\n%s\n(exit %d)\n\n' "$*" "$out" "$rc" >>"$dir/steps.log"
  signalled "$rc" && interrupted
  if (($(wc -l <<<"$out") > 40)); then
    head -36 <<<"$out" | clip | indent
    printf '  %s… %d more lines in var/demo/steps.log%s\n' "$D" $(($(wc -l <<<"$out") - 36)) "$N"
  else
    clip <<<"$out" | indent
  fi
  ((rc == want)) || fail "\`$*\` exited $rc, want $want"
}

# live CMD...: a command with a live display (parity diff start --watch): straight to the
# terminal, so its progress line redraws in place there. Sets $rc.
live() {
  shown "$*"
  { "$@" 2>&1 && echo 0 >"$dir/rc" || echo $? >"$dir/rc"; } | tee -a "$dir/steps.log" | indent
  rc=$(cat "$dir/rc")
  signalled "$rc" && interrupted
  return 0
}
if $tty; then
  live() {
    shown "$*"
    rc=0
    "$@" || rc=$?
    signalled "$rc" && interrupted
    return 0
  }
fi

# address DSN: host:port of a go-sql-driver DSN (user[:password]@tcp(host:port)/).
address() {
  local a=${1#*tcp(}
  echo "${a%%)*}"
}
# sql DSN STATEMENTS: run statements with the mariadb client on the server of a DSN.
sql() {
  local dsn=$1 user pass hostport
  user=${dsn%%@*}
  pass=""
  if [[ $user == *:* ]]; then pass=${user#*:} user=${user%%:*}; fi
  hostport=$(address "$dsn")
  local client=mysql
  command -v mariadb >/dev/null 2>&1 && client=mariadb
  MYSQL_PWD="$pass" "$client" --protocol=tcp -h "${hostport%:*}" -P "${hostport##*:}" -u "$user" -N -B -e "$2"
}

# status_line: one line of `parity status --json` (protojson, one field a line; jq not
# needed): applied and resolved lag, verification freshness, rows applied, Kafka lag.
status=""
field() { sed -n "s/^ *\"$1\": *\"\{0,1\}\([-0-9.e+]*\).*/\1/p" <<<"$status" | head -1; }
num() { # protojson leaves zeros out
  local v
  v=$(field "$1")
  echo "${v:-0}"
}
status_line() {
  local rc=0
  status=$(parity status --json --timeout 5s 2>/dev/null) || rc=$?
  signalled "$rc" && interrupted
  ((rc == 0)) || return 1
  local fresh kafka
  fresh=$(sed -n 's/^ *"freshness": *"\([0-9.]*\)s".*/\1/p' <<<"$status" | head -1)
  if [[ -n $fresh ]]; then fresh=$(printf '%.1fs' "$fresh"); else fresh="never verified"; fi
  kafka=$(sed -n 's/^ *"lag": *"\{0,1\}\([0-9]*\).*/\1/p' <<<"$status" | awk '{s+=$1} END {print s+0}')
  local resolved="     —" # no resolved ts read from Kafka yet
  [[ -z $(field resolvedLagSeconds) ]] || resolved=$(printf '%5.2fs' "$(num resolvedLagSeconds)")
  line=$(printf '%s  applied lag %6.2fs · resolved lag %s · freshness %-14s · %7d rows applied · Kafka lag %6d records' \
    "$(date +%T)" "$(num appliedLagSeconds)" "$resolved" "$fresh" "$(num rowsApplied)" "$kafka")
}
# watch_status SECONDS UNTIL: the status line, redrawn in place on a terminal (a line
# every second otherwise), for SECONDS or until the command UNTIL succeeds.
watch_status() {
  local secs=$1 until=$2 n=0 end=$((SECONDS + $1)) last=-10
  while ((SECONDS < end)); do
    if ! kill -0 "$serve_pid" 2>/dev/null; then
      $tty && echo
      tail -20 "$dir/serve.log" >&2
      fail "parity serve exited"
    fi
    if status_line; then
      n=$((n + 1))
      if $tty; then
        printf '\r\e[K  %s' "$line"
      elif ((SECONDS - last >= 1)); then
        printf '  %s\n' "$line"
        last=$SECONDS
      fi
      if [[ -n $until ]] && $until; then
        $tty && echo
        return 0
      fi
    fi
    sleep 0.25
  done
  $tty && echo
  [[ -z $until ]] || return 1
}

run_id() { # the newest run of a trigger (only the demo starts runs on this daemon)
  parity diff list --trigger "$1" --limit 1 --json | sed -n 's/^ *"name": *"diffs\/\([^"]*\)".*/\1/p' | head -1
}

printf '%sparity — a tour%s\n' "$B" "$N"
cat <<EOF
   A team moves its MySQL application to TiDB and keeps a fallback MySQL fed from TiDB
   by a TiCDC changefeed ($protocol, through Kafka), so it can roll back. parity is
   the daemon that applies that changefeed to the fallback and proves, while it runs,
   that the fallback holds exactly what TiDB holds. A few minutes; Ctrl-C stops it cleanly.
EOF

# ---------------------------------------------------------------------------------------
chapter 1 "The environment" \
  "Real servers on loopback, started by scripts/env up (already running: make demo ran it)."
upver=$(sql "$PARITY_TEST_UPSTREAM_DSN" "SELECT VERSION()")
downver=$(sql "$PARITY_TEST_DOWNSTREAM_DSN" "SELECT VERSION()")
printf '  %-26s %s\n' "upstream TiDB" "$(address "$PARITY_TEST_UPSTREAM_DSN") ($upver)" \
  "Kafka (KRaft)" "$PARITY_TEST_KAFKA" \
  "fallback MariaDB (binlog)" "$(address "$PARITY_TEST_DOWNSTREAM_DSN") ($downver)"
# The demo's own state from a previous run: its databases and its meta schema.
for d in "$db" "$db2" "$db3"; do sql "$PARITY_TEST_UPSTREAM_DSN" "DROP DATABASE IF EXISTS \`$d\`"; done
for d in "$db" "$db2" "$db3" "$meta"; do sql "$PARITY_TEST_DOWNSTREAM_DSN" "DROP DATABASE IF EXISTS \`$d\`"; done

# ---------------------------------------------------------------------------------------
chapter 2 "The migration: import, then live writes on TiDB" \
  "parity loadgen stands in for the application and TiCDC: it creates sysbench tables, an" \
  "all-types table and a keyless one on TiDB, imports them into the fallback at one TSO" \
  "(as Dumpling + Lightning would), then writes ~$rate transactions/s on TiDB and publishes" \
  "each committed transaction to Kafka with its real commit ts, like a TiCDC changefeed."
shown "parity loadgen --database $db --tables 4 --import-rows $import_rows --rate $rate --topic $topic --protocol $protocol …"
setsid parity loadgen \
  --upstream-dsn "$PARITY_TEST_UPSTREAM_DSN" --downstream-dsn "$PARITY_TEST_DOWNSTREAM_DSN" \
  --brokers "$PARITY_TEST_KAFKA" --topic "$topic" --protocol "$protocol" --partitions 3 \
  --database "$db" --reset --tables 4 --import-rows "$import_rows" --import-ts-file "$dir/import_ts" \
  --dispatcher table --rate "$rate" --resolved-interval 1s \
  --log-level warn >"$dir/loadgen.out" 2>"$dir/loadgen.log" &
lg_pid=$!
until [[ -s $dir/import_ts ]]; do
  kill -0 "$lg_pid" 2>/dev/null || { cat "$dir/loadgen.log" >&2; fail "loadgen stopped before the import finished"; }
  sleep 0.5
done
import_ts=$(cat "$dir/import_ts")
ok "imported $((4 * import_rows)) sysbench rows (and the all-types and keyless tables) into the fallback at TSO $import_ts"
note "the changefeed starts there; the workload is running on TiDB now"

# ---------------------------------------------------------------------------------------
chapter 3 "parity serve catches up" \
  "parity is not running yet, so a backlog builds up for ${backlog}s; then the daemon starts at" \
  "the import TSO, applies the changefeed in commit-ts order, exactly once, and catches up." \
  "Applied lag: how far the fallback is behind TiDB. Freshness: how old the newest proof" \
  "that the two are equal is (none yet)."
cat >"$dir/parity.toml" <<TOML
[changefeed]
id = "demo-$run"
brokers = ["$PARITY_TEST_KAFKA"]
topics = ["$topic"]
protocol = "$protocol"
time-zone = "+00:00"
start-ts = $import_ts   # the import TSO, as a TiCDC changefeed's --start-ts

[upstream]
dsn = "$PARITY_TEST_UPSTREAM_DSN"

[downstream]
dsn = "$PARITY_TEST_DOWNSTREAM_DSN"

[applier]
meta-schema = "$meta"
spill-dir = "$dir/spill"

[status]
addr = "$status_addr"   # /metrics, /status, /healthz

[api]
addr = "$PARITY_API_ADDR"   # gRPC: what the parity CLI and cutover runbooks call

[verify]
enabled = true
tables = ["$db.*", "$db2.*"]
caught-up-lag = "5s"
ts-map-interval = "1s"

[bypass]
enabled = true          # writes straight into the fallback: found, classed, and checked at cutover
schemas = ["$db", "$db2"]

[log]
level = "warn"
TOML
chmod 600 "$dir/parity.toml"
sleep "$backlog"
shown "parity serve --config var/demo/parity.toml"
sed -n '/^\[verify\]/,/^$/p' "$dir/parity.toml" | indent
note "(the whole file: var/demo/parity.toml; every key: deploy/parity.example.toml)"
setsid parity serve --config "$dir/parity.toml" >"$dir/serve.log" 2>&1 &
serve_pid=$!
shown "parity status --watch   # here: the same fields, one line"
# Caught up: the applied lag under 1.5s at three readings in a row; the line stays at
# least 8s, to see it live.
caught=0 since=$SECONDS
caught_up() {
  if [[ -n $(field appliedTs) ]] && awk -v l="$(field appliedLagSeconds)" 'BEGIN { exit !(l + 0 < 1.5) }'; then
    caught=$((caught + 1))
  else
    caught=0
  fi
  ((caught >= 3 && SECONDS - since >= 8))
}
watch_status 180 caught_up ||
  fail "parity serve did not catch up within 3 minutes (var/demo/serve.log)"
ok "caught up on ${backlog}s of backlog: the fallback follows TiDB within a second or two"
step 0 parity status

# ---------------------------------------------------------------------------------------
chapter 4 "Prove it: a full verification while replication goes on" \
  "A full run compares every row of every table, chunk by chunk, at snapshot pairs: TiDB" \
  "read at a TSO, the fallback held by parity at exactly that TSO for a moment (the pause" \
  "below), without stopping replication or the application. Exit 0 means equal."
live parity diff start --scope full --watch
((rc == 0)) || fail "the full run under load exited $rc, want 0 (equal)"
full=$(run_id manual)
[[ -n $full ]] || fail "no manual run in parity diff list"
parity diff get "$full" --json >"$reports/$full.json"
parity diff get "$full" >"$reports/$full.txt"
ok "equal: every table matches TiDB at its snapshot pair"
note "its report: var/demo/reports/$full.{txt,json} (parity diff get $full [--json]);"
note "every run is kept in the meta schema: parity diff list"
echo
note "freshness now counts from that proof:"
watch_status 4 ""

# ---------------------------------------------------------------------------------------
chapter 5 "The first database goes quiet; a second one comes alive" \
  "So that what we do to $db next is not overwritten by its own workload, its load" \
  "stops; a new load on $db2 starts and runs to the end. $db2 exists only on TiDB:" \
  "its CREATE DATABASE and CREATE TABLEs reach the fallback through the changefeed."
stop_pid "$lg_pid"
lg_pid=""
final1=$(sed -n 's/^resolved_ts=//p' "$dir/loadgen.out")
[[ -n $final1 ]] || { cat "$dir/loadgen.log" >&2; fail "loadgen on $db printed no final resolved ts"; }
ok "$db: $(grep '^transactions=' "$dir/loadgen.out"); its last change is at or before TSO $final1"
shown "parity loadgen --database $db2 --tables 4 --rate $rate --topic $topic --protocol $protocol …"
setsid parity loadgen \
  --upstream-dsn "$PARITY_TEST_UPSTREAM_DSN" --downstream-dsn "$PARITY_TEST_DOWNSTREAM_DSN" \
  --brokers "$PARITY_TEST_KAFKA" --topic "$topic" --protocol "$protocol" --partitions 0 \
  --database "$db2" --reset --tables 4 --all-types=false --keyless=false \
  --dispatcher table --rate "$rate" --resolved-interval 1s \
  --log-level warn >"$dir/loadgen2.out" 2>"$dir/loadgen2.log" &
lg2_pid=$!
step 0 parity wait-applied --ts "$final1" --timeout 2m
for _ in $(seq 120); do
  n=$(sql "$PARITY_TEST_DOWNSTREAM_DSN" "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '$db2'")
  ((n == 4)) && break
  kill -0 "$lg2_pid" 2>/dev/null || { cat "$dir/loadgen2.log" >&2; fail "loadgen on $db2 stopped"; }
  sleep 0.5
done
((n == 4)) || fail "$db2's 4 tables did not reach the fallback within a minute"
ok "$db is fully applied; $db2's tables were created in the fallback by the changefeed"

# ---------------------------------------------------------------------------------------
chapter 6 "Something writes to the fallback behind replication's back" \
  "A stray job, a hotfix on the wrong server: three writes straight into the fallback" \
  "that TiDB never saw. The next full run must find each one — with its kind, and its" \
  "class: where the difference came from (bypass: a write the bypass detector saw in the" \
  "fallback's binlog that parity did not make; imported: a key the changefeed never" \
  "changed; post-import: changed while catching up; cdc: changed during live" \
  "replication) — while $db2's load goes on."
t="$db.sbtest1"
maxid=$(sql "$PARITY_TEST_DOWNSTREAM_DSN" "SELECT MAX(id) FROM \`$db\`.sbtest1")
upd=7
del=$maxid
ins=$((maxid + 1000))
inject="UPDATE $t SET k = k + 1 WHERE id = $upd;
DELETE FROM $t WHERE id = $del;
INSERT INTO $t (id, k, c, pad) VALUES ($ins, 1, 'not in TiDB', 'demo');"
hostport=$(address "$PARITY_TEST_DOWNSTREAM_DSN")
shown "mariadb -h ${hostport%:*} -P ${hostport##*:}   # the fallback"
sed 's/^/  > /' <<<"$inject"
sql "$PARITY_TEST_DOWNSTREAM_DSN" "$inject"
echo
live parity diff start --scope full --watch
((rc == 1)) || fail "the full run after the injection exited $rc, want 1 (differences)"
found=$(run_id manual)
step 0 parity diff differences "$found"
# Exactly the three keys (TABLE KIND CLASS KEY ...), each with its kind, all classified.
for want in "differing id=$upd" "missing id=$del" "extra id=$ins"; do
  awk -v t="$t" -v kind="${want% *}" -v key="${want#* }" \
    '$1 == t && $2 == kind && $4 == key && $3 != "unclassified" { found = 1 } END { exit !found }' <<<"$out" ||
    fail "parity diff differences did not list $t $want with a class"
done
n=$(awk -v a="$db." -v b="$db2." 'index($1, a) == 1 || index($1, b) == 1' <<<"$out" | wc -l)
((n == 3)) || fail "parity diff differences listed $n differences, want 3"
ok "found all three, nothing else: each key with its kind and class; never row values"
step 0 parity diff fix-sql "$found"
note "(to review or apply by hand; parity repair below does it safely instead)"
echo
step 0 parity repair "$found"
ok "repaired inside the applier's barrier at its checkpoint, and re-verified"
live parity diff start --scope full --watch
((rc == 0)) || fail "the full run after the repair exited $rc, want 0 (equal)"
clean=$(run_id manual)
parity diff get "$clean" --json >"$reports/$clean.json"
parity diff get "$clean" >"$reports/$clean.txt"
ok "clean again: report in var/demo/reports/$clean.{txt,json}"

# ---------------------------------------------------------------------------------------
chapter 7 "The cutover" \
  "The maintenance window (deploy/runbook.md, Cutover): writes stop; once TiDB is quiet," \
  "its current TSO is the quiescent point. wait-applied returns when the fallback has" \
  "everything up to it; cutover-check verifies every key changed since each table's last" \
  "clean full run — by the changefeed, or straight in the fallback as the bypass detector" \
  "saw — at a snapshot pair after it, and answers pass or fail with the evidence."
note "stopping the writes (loadgen on $db2)"
stop_pid "$lg2_pid"
lg2_pid=""
[[ -n $(sed -n 's/^resolved_ts=//p' "$dir/loadgen2.out") ]] || { cat "$dir/loadgen2.log" >&2; fail "loadgen on $db2 printed no final resolved ts"; }
ok "$db2: $(grep '^transactions=' "$dir/loadgen2.out")"
# TiCDC keeps resolving TSOs while TiDB is idle; a loadgen stopped by a signal publishes
# no more (its heartbeat follows only a workload that ended by --duration or
# --transactions), so a trickle to a third database outside verify.tables keeps the
# changefeed's resolved ts moving (without it no TSO after the last write would resolve).
setsid parity loadgen \
  --upstream-dsn "$PARITY_TEST_UPSTREAM_DSN" --downstream-dsn "$PARITY_TEST_DOWNSTREAM_DSN" \
  --brokers "$PARITY_TEST_KAFKA" --topic "$topic" --protocol "$protocol" --partitions 0 \
  --database "$db3" --reset --tables 1 --workers 1 --rows-per-txn 1 --all-types=false --keyless=false \
  --rate 2 --resolved-interval 500ms --log-level warn >"$dir/ticks.out" 2>"$dir/ticks.log" &
lg3_pid=$!
note "(TiCDC's resolved ts goes on while TiDB is idle: here 2 writes/s to $db3, not verified)"
step 0 parity wait-applied --now --timeout 2m
step 0 parity cutover-check --now --timeout 5m
grep -q 'PASSED' <<<"$out" || fail "parity cutover-check exited 0 without PASSED"
parity cutover-check --now --timeout 5m --json >"$reports/cutover-evidence.json" || fail "parity cutover-check --now --json did not pass"
ok "cutover check passed: safe to point the application at TiDB, with a proven fallback"
note "evidence to keep with the change record: var/demo/reports/cutover-evidence.json (--json)"

# ---------------------------------------------------------------------------------------
chapter 8 "Watching it in production: metrics, dashboards, alerts" \
  "On-call watches lag and freshness on dashboards, and alerts wake them. parity serve" \
  "exports Prometheus metrics on its status address:"
want='^parity_(cdc_checkpoint_lag_seconds|cdc_resolved_lag_seconds|verify_freshness_seconds|verify_runs_total)'
shown "curl -s http://$status_addr/metrics | grep -E '$want'"
metrics=$(curl -fsS "http://$status_addr/metrics") || fail "GET /metrics failed"
grep -E '^parity_' <<<"$metrics" >"$dir/metrics.txt" || true
grep -E "$want" <<<"$metrics" | head -12 | indent
grep -q '^parity_verify_runs_total{.*trigger="cutover-check"' <<<"$metrics" || fail "/metrics counts no cutover-check run"
printf '  %s… %d parity_* series in all (var/demo/metrics.txt); /status and /healthz beside it%s\n' "$D" "$(wc -l <"$dir/metrics.txt")" "$N"
(($(wc -l <"$dir/metrics.txt") > 20)) || fail "/metrics has almost no parity_* series"
echo
cat <<EOF
  ${B}dashboards/${N}            Grafana JSON (Grafana 11/12): replication.json, verification.json,
                         cutover.json — each with datasource and changefeed variables
  ${B}deploy/grafana/${N}        provisioning: datasource.yml → /etc/grafana/provisioning/datasources/,
                         dashboards.yml → /etc/grafana/provisioning/dashboards/, and the JSON
                         files → /var/lib/grafana/dashboards/parity/ (or Dashboards → Import)
  ${B}deploy/prometheus/${N}     prometheus.yml (scrape status.addr as job "parity"), parity-alerts.yml
                         (9 alerts, each with a runbook_url into deploy/runbook.md#alerts),
                         parity-alerts_test.yml (promtool unit tests)
  ${B}deploy/runbook.md${N}      the cutover procedure you just ran, and what to do when an alert fires
EOF
promtool=""
if command -v promtool >/dev/null 2>&1; then
  promtool=promtool
elif [[ -x ${PARITY_PROMETHEUS_DIR:-}/promtool ]]; then
  promtool="$PARITY_PROMETHEUS_DIR/promtool"
fi
echo
if [[ -n $promtool ]]; then
  PATH="$(dirname "$(command -v "$promtool")"):$PATH"
  step 0 promtool check rules deploy/prometheus/parity-alerts.yml
  step 0 promtool test rules deploy/prometheus/parity-alerts_test.yml
else
  note "check them with: promtool check rules deploy/prometheus/parity-alerts.yml;"
  note "(cd deploy/prometheus && promtool test rules parity-alerts_test.yml)"
fi

# ---------------------------------------------------------------------------------------
echo
shown "kill -TERM <parity serve>   # finishes the round being applied and exits 0"
kill -TERM "$serve_pid"
rc=0
wait "$serve_pid" || rc=$?
serve_pid=""
((rc == 0)) || fail "parity serve exited $rc after SIGTERM, want 0 (var/demo/serve.log)"
printf '\n%sThe end — %ds.%s The environment keeps running (scripts/env down stops it).\n' "$B" $((SECONDS - started)) "$N"
cat <<EOF
   Config, logs and reports: var/demo/ (steps.log has every command's full output).
   Next: README.md, docs/serve.md (the daemon), docs/verify.md (verification),
   docs/diff.md (parity diff without a daemon), api/README.md (the gRPC API).
EOF

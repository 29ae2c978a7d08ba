package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
)

// repairCLI asks the daemon's POST /repair with `parity repair`'s args (the CLI calls the
// gRPC API, which the same repairer serves) and decodes its answer.
func repairCLI(t *testing.T, addr string, want int, args ...string) daemon.RepairResult {
	t.Helper()
	code, out, errs := runRepairHTTP(t, addr, args...)
	if code != want {
		t.Fatalf("parity repair %v: exit %d (%s), want %d\n%s", args, code, errs, want, out)
	}
	var resp daemon.RepairResult
	if err := json.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("parity repair %v output: %v\n%s", args, err, out)
	}
	return resp
}

// outcomes maps "table key" to the action taken.
func outcomes(resp daemon.RepairResult) map[string]cdc.RepairAction {
	m := map[string]cdc.RepairAction{}
	for _, o := range resp.Outcomes {
		m[o.Key.Table+" "+o.Key.Text] = o.Action
	}
	return m
}

// TestRepairUnderLoad (#17 item 6): loadgen runs transactions on TiDB, published through
// real Kafka into an in-process `parity serve` with verification. Divergences are
// injected into the fallback (an update, a delete and an insert on rows loadgen never
// touches, rows loadgen owns, a row of every type TiDB has and the fallback lacks, an
// extra copy in the keyless table); `parity verify` reports exactly them; `parity repair
// --dry-run` says what it would do and changes nothing; `parity repair --table` repairs
// one table only; `parity repair` repairs the keyed tables while the load goes on (each
// key recorded in the meta schema), refuses the keyless table's difference, and its
// re-verification at a new pair finds only that one left (exit 1); once it is removed
// the next full verification is clean. A run id that does not exist fails with exit 2.
func TestRepairUnderLoad(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "repair", 3)
	db := testenv.UniqueName("repair")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	up, err := sql.Open("mysql", upDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 3, 8, 2000
		lg.Rate, lg.RowsPerTxn = 0, 20
	})
	importTs := load.ImportTs
	cfg := verifyServeConfig(t, "repair-load", upDSN, down, broker, topic, db, importTs)
	addr := cfg.Status.Addr
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := runServeInTest(t, ctx, cfg)
	defer srv.Close()
	status := srv.Status
	deadline := time.Now().Add(90 * time.Second)
	for {
		if st, _, err := fetchStatus(ctx, addr); err == nil && st.AppliedTs > importTs && st.AppliedLagSeconds < 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not catch up within 90s")
		}
		time.Sleep(200 * time.Millisecond)
	}

	exec := func(d *sql.DB, q string, args ...any) {
		t.Helper()
		if _, err := d.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	tbl := func(name string) string { return ident.Table(db, name) }
	// Rows loadgen never touches (it picks ids below its next id), written to both
	// sides as an import would, then diverged in the fallback.
	for _, side := range []*sql.DB{up, down.DB} {
		exec(side, "INSERT INTO "+tbl("sbtest1")+" (id, k, c, pad) VALUES (50000001, 1, 'one', 'p1'), (50000002, 2, 'two', 'p2'), (50000003, 3, 'three', 'p3')")
		exec(side, "INSERT INTO "+tbl("sbtest2")+" (id, k, c, pad) VALUES (50000001, 1, 'one', 'p1')")
	}
	// A case-insensitive key spelled differently in the fallback: the same key to the
	// collation, a different row to a byte reader; REPLACE rewrites the key column.
	exec(up, "CREATE TABLE "+tbl("ci")+" (k VARCHAR(10) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)")
	exec(up, "INSERT INTO "+tbl("ci")+" VALUES ('abc', 1)")
	exec(down.DB, "CREATE TABLE "+tbl("ci")+" (k VARCHAR(10) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, v INT)")
	exec(down.DB, "INSERT INTO "+tbl("ci")+" VALUES ('ABC', 1)")
	exec(down.DB, "UPDATE "+tbl("sbtest1")+" SET c = 'diverged' WHERE id = 50000001")
	exec(down.DB, "DELETE FROM "+tbl("sbtest1")+" WHERE id = 50000002")
	exec(down.DB, "INSERT INTO "+tbl("sbtest1")+" (id, k, c, pad) VALUES (50000010, 10, 'extra', 'p10')")
	exec(down.DB, "UPDATE "+tbl("sbtest2")+" SET pad = 'diverged' WHERE id = 50000001")
	// A row of every type that the fallback lacks (TiDB only: no changefeed event).
	exec(up, "SET time_zone = '+00:00'")
	exec(up, "INSERT INTO "+tbl("alltypes")+` VALUES (50000001, -128, 255, -32768, -8388608, -2147483648, 4294967295,
		-9223372036854775808, 18446744073709551615, 1.2345678, 2.718281828459045, 12345678901234.123456,
		'quote '' and \\ backslash', '测试中文字符 😀', x'00ff', x'deadbeef', 'tiny', 'text', 'medium', 'long',
		x'01', x'0203', x'', NULL, '2024-02-29', '2024-02-29 23:59:59', '2024-02-29 23:59:59.123456',
		'2024-03-01 01:02:03', '2024-03-01 01:02:03.456', '-838:59:59', '12:34:56.789', 2024, 'b', 'x,z', b'1010101010',
		'{"a": [1, 2.5, "x"], "b": null}')`)
	// An extra copy of a row of the keyless table: not repairable by key.
	exec(down.DB, "INSERT INTO "+tbl("keyless")+" (a, b) VALUES (999999, 'repair-extra')")
	// Rows loadgen owns: replication may change them again before the run (then they
	// converge and are not reported), so they may or may not be differences.
	exec(down.DB, "DELETE FROM "+tbl("sbtest3")+" WHERE id IN (5, 6)")
	exec(down.DB, "UPDATE "+tbl("sbtest3")+" SET c = 'diverged' WHERE id = 7")
	owned := map[string]bool{"sbtest3 id=5": true, "sbtest3 id=6": true, "sbtest3 id=7": true}
	fixed := map[string]checker.DiffKind{
		"sbtest1 id=50000001": checker.Differing, "sbtest1 id=50000002": checker.Missing, "sbtest1 id=50000010": checker.Extra,
		"sbtest2 id=50000001": checker.Differing, "alltypes id=50000001": checker.Missing,
		"keyless a=999999, b='repair-extra'": checker.Extra,
	}

	// The verification's pair must see TiDB's writes above: wait until the applier is
	// past them (a pair's TSO is at least the applied checkpoint).
	written := testenv.TiDBTSO(t, up)
	for deadline := time.Now().Add(time.Minute); status().AppliedTs < written; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the applier did not pass ts %d within a minute", written)
		}
	}

	// The verification reports exactly them.
	found := verifyCLIExit(t, addr, 1)
	if found.Result != verify.ResultDifferent {
		t.Fatalf("verification after the divergences: %+v", found)
	}
	meta, err := sql.Open("mysql", down.Root)
	if err != nil {
		t.Fatal(err)
	}
	defer meta.Close()
	reported := map[string]checker.DiffKind{}
	for _, tr := range found.Tables {
		diffs, err := checker.RunDifferences(ctx, meta, cfg.Applier.MetaSchema, tr.DiffRunID, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range diffs {
			if d.UpSchema != db || d.DownSchema != db || d.UpTable != tr.Table || len(d.KeyValues) != len(d.KeyColumns) {
				t.Fatalf("stored difference %+v of table %s", d, tr.Table)
			}
			reported[d.UpTable+" "+d.Key] = d.Kind
		}
	}
	for k, kind := range fixed {
		if reported[k] != kind {
			t.Errorf("verification %s: %s reported as %q, want %q", found.RunID, k, reported[k], kind)
		}
	}
	ciKeys := 0
	for k := range reported {
		if strings.HasPrefix(k, "ci ") {
			if k != "ci k='abc'" && k != "ci k='ABC'" {
				t.Errorf("verification %s reported %s (%s)", found.RunID, k, reported[k])
			}
			ciKeys++
			continue
		}
		if _, ok := fixed[k]; !ok && !owned[k] {
			t.Errorf("verification %s reported %s (%s), which was not diverged", found.RunID, k, reported[k])
		}
	}
	if ciKeys == 0 {
		t.Errorf("verification %s did not report the key spelled 'ABC' in the fallback", found.RunID)
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("verification %s: %d differences (%d on rows loadgen owns, %d of the case-insensitive key)", found.RunID, len(reported), len(reported)-len(fixed)-ciKeys, ciKeys)
	ciRow := func() string {
		t.Helper()
		var k string
		if err := down.QueryRowContext(ctx, "SELECT CAST(k AS BINARY) FROM "+tbl("ci")).Scan(&k); err != nil {
			t.Fatal(err)
		}
		return k
	}

	fallbackRow := func(table string, id int64) string {
		t.Helper()
		var c, pad string
		err := down.QueryRowContext(ctx, "SELECT c, pad FROM "+tbl(table)+" WHERE id = ?", id).Scan(&c, &pad)
		if errors.Is(err, sql.ErrNoRows) {
			return "<none>"
		}
		if err != nil {
			t.Fatal(err)
		}
		return c + "/" + pad
	}
	repairsRecorded := func() int {
		t.Helper()
		var n int
		if err := down.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+metaschema.Table(cfg.Applier.MetaSchema, cdc.RepairsTable)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// A dry run says what it would do and changes nothing.
	dry := repairCLI(t, addr, 1, "--run", found.RunID, "--dry-run")
	got := outcomes(dry)
	wantDry := map[string]cdc.RepairAction{
		"sbtest1 id=50000001": cdc.RepairUpsert, "sbtest1 id=50000002": cdc.RepairUpsert, "sbtest1 id=50000010": cdc.RepairDelete,
		"sbtest2 id=50000001": cdc.RepairUpsert, "alltypes id=50000001": cdc.RepairUpsert,
		"keyless a=999999, b='repair-extra'": cdc.RepairRefused,
	}
	for k, a := range wantDry {
		if got[k] != a {
			t.Errorf("dry run: %s %q, want %q", k, got[k], a)
		}
	}
	if !dry.DryRun || dry.Reverify != nil || len(dry.Outcomes) != len(reported) || dry.Barriers == 0 {
		t.Errorf("dry run: %+v", dry)
	}
	for _, o := range dry.Outcomes {
		if o.Action == cdc.RepairRefused && !strings.Contains(o.Reason, "no primary key or NOT NULL unique key") {
			t.Errorf("dry run refused %s %s: %q", o.Key.Table, o.Key.Text, o.Reason)
		}
	}
	for _, o := range dry.Outcomes {
		if o.Key.Table == "ci" && o.Action != cdc.RepairUpsert {
			t.Errorf("dry run: ci %s %q, want upsert", o.Key.Text, o.Action)
		}
	}
	if k := ciRow(); k != "ABC" {
		t.Fatalf("after the dry run the fallback's ci key is %q", k)
	}
	if r1, r2, r10 := fallbackRow("sbtest1", 50000001), fallbackRow("sbtest1", 50000002), fallbackRow("sbtest1", 50000010); r1 != "diverged/p1" || r2 != "<none>" || r10 != "extra/p10" {
		t.Fatalf("after the dry run the fallback holds %q, %q, %q: it changed", r1, r2, r10)
	}
	if n := repairsRecorded(); n != 0 {
		t.Fatalf("the dry run recorded %d repairs", n)
	}
	if t.Failed() {
		t.FailNow()
	}

	// --table: only sbtest2 is repaired and verified again.
	one := repairCLI(t, addr, 0, "--run", found.RunID, "--table", db+".sbtest2")
	if len(one.Outcomes) != 1 || outcomes(one)["sbtest2 id=50000001"] != cdc.RepairUpsert || one.Reverify == nil ||
		one.Reverify.Result != verify.ResultEqual || one.Reverify.TablesCompared != 1 || !slices.Equal(one.Tables, []string{db + ".sbtest2"}) {
		t.Fatalf("repair --table sbtest2: %+v, reverify %+v", one, one.Reverify)
	}
	if r := fallbackRow("sbtest2", 50000001); r != "one/p1" {
		t.Fatalf("sbtest2 50000001 after its repair: %q", r)
	}
	if r := fallbackRow("sbtest1", 50000001); r != "diverged/p1" {
		t.Fatalf("repair --table sbtest2 changed sbtest1: %q", r)
	}
	if code, _, errs := runRepairHTTP(t, addr, "--run", found.RunID, "--table", db+".nosuch"); code != 2 || !strings.Contains(errs, "not among the tables") {
		t.Fatalf("repair --table of a table not in the run: exit %d, %s", code, errs)
	}

	// The keyed tables, while the load goes on: clean at once.
	st0 := status()
	keyed := repairCLI(t, addr, 0, "--run", found.RunID, "--table", db+".sbtest*", "--table", db+".alltypes", "--table", db+".ci")
	st1 := status()
	got = outcomes(keyed)
	for k, a := range map[string]cdc.RepairAction{
		"sbtest1 id=50000001": cdc.RepairUpsert, "sbtest1 id=50000002": cdc.RepairUpsert, "sbtest1 id=50000010": cdc.RepairDelete,
		"sbtest2 id=50000001": cdc.RepairUnchanged, "alltypes id=50000001": cdc.RepairUpsert,
	} {
		if got[k] != a {
			t.Errorf("repair: %s %q, want %q", k, got[k], a)
		}
	}
	for k, a := range got {
		if owned[k] && a == cdc.RepairRefused {
			t.Errorf("repair refused %s", k)
		}
	}
	if keyed.Reverify == nil || keyed.Reverify.Result != verify.ResultEqual || keyed.Reverify.TablesCompared != len(keyed.Tables) || keyed.Reverify.Resolved != 0 {
		t.Fatalf("re-verification after the repair: %+v", keyed.Reverify)
	}
	if k := ciRow(); k != "abc" {
		t.Fatalf("after the repair the fallback's ci key is %q, want TiDB's 'abc'", k)
	}
	if st1.RowsApplied <= st0.RowsApplied {
		t.Fatalf("nothing was applied during the repair (%d rows before, %d after): the load did not go on", st0.RowsApplied, st1.RowsApplied)
	}
	if ended, err := load.Ended(); ended {
		t.Fatalf("the load ended during the repair: %v", err)
	}
	for _, o := range keyed.Outcomes {
		if o.TS < found.LastTS || o.TS > st1.AppliedTs {
			t.Errorf("%s %s repaired at ts %d, outside (%d, %d]", o.Key.Table, o.Key.Text, o.TS, found.LastTS, st1.AppliedTs)
		}
	}
	t.Logf("repair %s: %d keys (%d upserted, %d deleted, %d unchanged) in %d barrier(s), longest %v, %d rows applied meanwhile; re-verification %s equal",
		keyed.ID, len(keyed.Outcomes), keyed.Upserted, keyed.Deleted, keyed.Unchanged, keyed.Barriers, keyed.MaxPause,
		st1.RowsApplied-st0.RowsApplied, keyed.Reverify.RunID)

	// Every table: the keyless difference is refused and remains.
	all := repairCLI(t, addr, 1, "--run", found.RunID)
	if outcomes(all)["keyless a=999999, b='repair-extra'"] != cdc.RepairRefused || all.Refused != 1 || all.Reverify == nil ||
		all.Reverify.Result != verify.ResultDifferent || all.Reverify.Differences != 1 {
		t.Fatalf("repair of every table: %+v, reverify %+v", all, all.Reverify)
	}
	for _, tr := range all.Reverify.Tables {
		if (tr.Table == loadgen.KeylessTable) != (tr.Differences == 1) {
			t.Fatalf("re-verification %s: %+v", all.Reverify.RunID, tr)
		}
	}

	// The meta schema holds every key of both repairs.
	rows, err := down.QueryContext(ctx, "SELECT repair_id, run_id, table_name, row_key, action, repair_ts, COALESCE(reason, '') FROM "+
		metaschema.Table(cfg.Applier.MetaSchema, cdc.RepairsTable)+" WHERE changefeed = ? ORDER BY repair_id, seq", cfg.Changefeed.ID)
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string][]string{}
	for rows.Next() {
		var id, run, table, key, action, reason string
		var ts uint64
		if err := rows.Scan(&id, &run, &table, &key, &action, &ts, &reason); err != nil {
			t.Fatal(err)
		}
		if run != found.RunID || ts == 0 || (action == "refused") != (reason != "") {
			t.Fatalf("recorded repair: %s %s %s %s %s %d %q", id, run, table, key, action, ts, reason)
		}
		recorded[id] = append(recorded[id], table+" "+key+" "+action)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []daemon.RepairResult{one, keyed, all} {
		var want []string
		for _, o := range r.Outcomes {
			want = append(want, o.Key.Table+" "+o.Key.Text+" "+string(o.Action))
		}
		if !slices.Equal(recorded[r.ID], want) {
			t.Fatalf("repair %s recorded\n  %v\nwant\n  %v", r.ID, recorded[r.ID], want)
		}
	}
	if len(recorded) != 3 {
		t.Fatalf("%d repairs recorded, want 3", len(recorded))
	}

	// Removed by hand, the next full verification is clean.
	exec(down.DB, "DELETE FROM "+tbl("keyless")+" WHERE a = 999999 AND b = 'repair-extra' LIMIT 1")
	if clean := verifyCLIExit(t, addr, 0); clean.Result != verify.ResultEqual || clean.TablesCompared != 6 {
		t.Fatalf("full verification after the repair: %+v", clean)
	}

	// A run that does not exist.
	code, out, errs := runRepairHTTP(t, addr, "--run", "v20000101T000000-00000000")
	if code != 2 || !strings.Contains(errs, "run v20000101T000000-00000000 not found") {
		t.Fatalf("repair of an unknown run: exit %d, %s\n%s", code, errs, out)
	}
	t.Logf("unknown run: %s", errs)
}

// verifyCLIExit asks the daemon's POST /verify/run with `parity verify`'s args (e.g.
// --scope), expecting its exit status want (the CLI calls the gRPC API).
func verifyCLIExit(t *testing.T, addr string, want int, args ...string) verify.RunRecord {
	t.Helper()
	code, out, errs := runVerifyHTTP(t, addr, args...)
	if code != want {
		t.Fatalf("parity verify: exit %d (%s), want %d\n%s", code, errs, want, out)
	}
	var rec verify.RunRecord
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("parity verify output: %v\n%s", err, out)
	}
	return rec
}

// The repair endpoint answers loopback clients only, wants a run, and says when the
// daemon cannot repair; without verification it is not mounted.
func TestRepairEndpointGuards(t *testing.T) {
	cfg := daemon.DefaultConfig()
	cfg.Changefeed.Brokers, cfg.Changefeed.Topics = []string{"127.0.0.1:1"}, []string{"t"}
	cfg.Upstream.DSN, cfg.Downstream.DSN = "u@tcp(127.0.0.1:1)/", "u@tcp(127.0.0.1:1)/"
	cfg.Verify.Enabled, cfg.Verify.Tables = true, []string{"app.*"}
	r, err := cdc.New(cfg.Parts().CDC, nil)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := verify.New(cfg.Parts().Verify, verify.Deps{Applier: daemon.Applier(r), BarrierPassed: cdc.ErrBarrierPassed})
	if err != nil {
		t.Fatal(err)
	}
	h := daemon.Handler(daemon.Components{Replicator: r, Verify: vs}, daemon.BuildInfo{}, false)
	for _, tc := range []struct {
		method, path, remote string
		want                 int
		says                 string
	}{
		{http.MethodPost, "/repair?run=x", "10.1.2.3:5555", http.StatusForbidden, "loopback"},
		{http.MethodPost, "/repair", "127.0.0.1:5555", http.StatusBadRequest, "run"},
		{http.MethodPost, "/repair?run=x&dry-run=maybe", "127.0.0.1:5555", http.StatusBadRequest, "dry-run"},
		{http.MethodPost, "/repair?run=x&table=nodot", "[::1]:5555", http.StatusBadRequest, "schema.table"},
		{http.MethodPost, "/repair?run=x", "127.0.0.1:5555", http.StatusServiceUnavailable, "not running"},
		{http.MethodGet, "/repair?run=x", "127.0.0.1:5555", http.StatusMethodNotAllowed, ""},
	} {
		req := httptest.NewRequest(tc.method, tc.path, nil)
		req.RemoteAddr = tc.remote
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.says) {
			t.Errorf("%s %s from %s: %d %s, want %d saying %q", tc.method, tc.path, tc.remote, w.Code, w.Body.String(), tc.want, tc.says)
		}
	}
	srv := httptest.NewServer(daemon.Handler(daemon.Components{Replicator: r, Verify: nil}, daemon.BuildInfo{}, false))
	defer srv.Close()
	code, _, errs := runRepairHTTP(t, strings.TrimPrefix(srv.URL, "http://"), "--run", "x")
	if code != 2 || !strings.Contains(errs, "verify.enabled") {
		t.Fatalf("POST /repair to a daemon without verification: exit %d, %s", code, errs)
	}
	if code, _, errs := runCLI(t, "repair"); code != 2 || !strings.Contains(errs, "--run") {
		t.Fatalf("parity repair without --run: exit %d, %s", code, errs)
	}
}

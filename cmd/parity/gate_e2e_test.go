package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestCutoverGateBypass (#29): the cutover gate never passes a fallback that differs,
// however the difference got there, against a live `parity serve` (real Kafka, TiDB,
// MariaDB, a loadgen workload running throughout) through the parity CLI:
//   - (a) bypass detection on: after a clean full run, rows changed straight in the
//     fallback — an UPDATE and a DELETE on a table the changefeed never touches (created
//     on both sides before the changefeed, selected by verify.tables) and an INSERT into
//     a replicated table at a key the changefeed never writes — make cutover-check exit 1
//     naming each key with its kind and class bypass; `parity repair` and a full run,
//     and it passes, its evidence naming the keys' two sources;
//   - (d) a DDL made straight in the fallback fails it naming the table (bypass-ddl);
//   - (c) detection stopped while a write is made, then restarted from its position: the
//     write is read then and the check fails naming it (nothing was missed); the
//     position deleted (what recovering from a purged binlog takes): a new stretch of
//     watching, and every table whose window starts before it is bypass-unwatched;
//   - (b) bypass detection off: bypass-unwatched for every table; with --full it passes
//     (the data are equal).
func TestCutoverGateBypass(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "gate", 3)
	db := testenv.UniqueName("gate")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 2, 2, 2000
		lg.AllTypes, lg.Keyless = false, false
		lg.Rate, lg.RowsPerTxn = 100, 5
	})
	up, err := sql.Open("mysql", upDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	quiet := ident.Table(db, "quiet")
	for _, q := range []string{
		"CREATE TABLE " + quiet + " (id INT NOT NULL PRIMARY KEY, v VARCHAR(40) NOT NULL)",
		"INSERT INTO " + quiet + " SELECT seq, CONCAT('row ', seq) FROM (SELECT 1 AS seq UNION SELECT 2 UNION SELECT 3 UNION SELECT 4 UNION SELECT 5 UNION SELECT 6 UNION SELECT 7 UNION SELECT 8) s",
	} {
		if _, err := up.ExecContext(ctx, q); err != nil {
			t.Fatalf("TiDB: %s: %v", q, err)
		}
		if _, err := down.ExecContext(ctx, q); err != nil {
			t.Fatalf("fallback: %s: %v", q, err)
		}
	}

	cfg := verifyServeConfig(t, "gate", upDSN, down, broker, topic, db, load.ImportTs)
	cfg.API.Addr = freeAddr(t)
	conn := []string{"--addr", cfg.API.Addr}
	with := func(args ...string) []string { return append(args, conn...) }
	serve := func(cfg daemon.Config) *testServe {
		t.Helper()
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		srv := runServeInTest(t, ctx, cfg)
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
			st, _, err := fetchStatus(ctx, cfg.Status.Addr)
			if err == nil && st.AppliedTs > load.ImportTs && st.AppliedLagSeconds < 3 && (!cfg.Bypass.Enabled || st.Bypass != nil && st.Bypass.State == "reading") {
				return srv
			}
			if ended, err := srv.Ended(); ended {
				t.Fatalf("serve ended: %v", err)
			}
			if ended, err := load.Ended(); ended {
				t.Fatalf("loadgen ended: %v", err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("serve not caught up within 2 minutes: %+v, %v", st, err)
			}
		}
	}
	fullRun := func() {
		t.Helper()
		cli(t, 0, with("diff", "start", "--scope", "full", "--watch", "--timeout", "5m")...)
	}
	check := func(wantCode int, extra ...string) *parityv1.CutoverCheckResponse {
		t.Helper()
		var cc parityv1.CutoverCheckResponse
		cliJSON(t, &cc, wantCode, with(append([]string{"cutover-check", "--now", "--timeout", "5m"}, extra...)...)...)
		t.Logf("cutover-check %s: passed %v, failures %q", strings.Join(extra, " "), cc.GetPassed(), cc.GetFailures())
		return &cc
	}
	tableResult := func(cc *parityv1.CutoverCheckResponse, table string) *parityv1.CutoverTable {
		t.Helper()
		i := slices.IndexFunc(cc.GetTables(), func(ct *parityv1.CutoverTable) bool { return ct.GetTable() == table })
		if i < 0 {
			t.Fatalf("no evidence of %s: %v", table, cc.GetTables())
		}
		return cc.GetTables()[i]
	}
	exec := func(q string) {
		t.Helper()
		if _, err := down.ExecContext(ctx, q); err != nil {
			t.Fatalf("fallback: %s: %v", q, err)
		}
	}
	tables := []string{db + ".quiet", db + ".sbtest1", db + ".sbtest2"}

	// (a) Bypass detection on.
	srv := serve(cfg)
	fullRun()
	const extraID = 900_000_001 // loadgen writes only ids it created or read back from TiDB
	exec("UPDATE " + quiet + " SET v = 'changed in the fallback' WHERE id = 3")
	exec("DELETE FROM " + quiet + " WHERE id = 5")
	exec(fmt.Sprintf("INSERT INTO %s (id, k, c, pad) VALUES (%d, 1, 'not in TiDB', 'gate')", ident.Table(db, "sbtest1"), extraID))
	cc := check(1)
	type diff struct{ table, kind, class, key string }
	var got []diff
	for _, d := range cc.GetDifferences() {
		got = append(got, diff{d.GetTable(), kindName(d.GetKind()), d.GetClass(), d.GetKey()})
	}
	want := []diff{{db + ".quiet", "differing", "bypass", "id=3"}, {db + ".quiet", "missing", "bypass", "id=5"}, {db + ".sbtest1", "extra", "bypass", fmt.Sprintf("id=%d", extraID)}}
	slices.SortFunc(got, func(a, b diff) int { return strings.Compare(a.table+a.key, b.table+b.key) })
	if !slices.Equal(got, want) || cc.GetBypass() != "on" {
		t.Fatalf("cutover check after writes straight into the fallback: differences %v, want %v (bypass %q)", got, want, cc.GetBypass())
	}
	if ct := tableResult(cc, db+".quiet"); ct.GetResult() != "different" || ct.GetBypass() != "included" || ct.GetBypassKeys() != 2 || ct.GetLedgerKeys() != 0 {
		t.Fatalf("quiet's evidence: %v", ct)
	}
	out := cli(t, 1, with("cutover-check", "--now", "--timeout", "5m")...)
	for _, w := range []string{"FAILED", "id=3", "id=5", fmt.Sprintf("id=%d", extraID), "bypass"} {
		if !strings.Contains(out, w) {
			t.Errorf("cutover-check's printout lacks %q:\n%s", w, out)
		}
	}
	cli(t, 0, with("repair", runIDOf(cc.GetDiff()))...)
	fullRun()
	cc = check(0)
	for _, tb := range tables {
		if ct := tableResult(cc, tb); ct.GetResult() != "equal" || ct.GetBypass() != "included" || ct.GetBypassWatchedSince() == nil {
			t.Fatalf("%s's evidence after the repair: %v", tb, ct)
		}
	}
	if tableResult(cc, db+".sbtest1").GetLedgerKeys() == 0 {
		t.Errorf("sbtest1 under load: no ledger keys verified")
	}

	// (d) A DDL straight in the fallback.
	exec("ALTER TABLE " + quiet + " ADD INDEX by_v (v)")
	cc = check(1)
	if ct := tableResult(cc, db+".quiet"); ct.GetResult() != "bypass-ddl" || len(ct.GetBypassDdl()) != 1 || !strings.Contains(ct.GetBypassDdl()[0], "ADD INDEX by_v") ||
		!slices.ContainsFunc(cc.GetFailures(), func(f string) bool { return strings.HasPrefix(f, db+".quiet: bypass-ddl") }) {
		t.Fatalf("cutover check after a DDL in the fallback: %v", cc)
	}
	exec("ALTER TABLE " + quiet + " DROP INDEX by_v")
	// The binlog times a DDL in whole seconds: one in the same second as the next full
	// run's pair cannot be told to be before it, and would fail the check.
	time.Sleep(1100 * time.Millisecond)
	fullRun()
	check(0)

	// (c) Detection stopped: a write meanwhile; restarted from its position, it reads it.
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	exec("UPDATE " + quiet + " SET v = 'changed while parity was down' WHERE id = 2")
	srv = serve(cfg)
	cc = check(1)
	if len(cc.GetDifferences()) != 1 || cc.GetDifferences()[0].GetKey() != "id=2" || cc.GetDifferences()[0].GetClass() != "bypass" {
		t.Fatalf("cutover check after a write while detection was stopped: %v", cc.GetDifferences())
	}
	cli(t, 0, with("repair", runIDOf(cc.GetDiff()))...)
	fullRun()
	check(0)
	// The position deleted: a new stretch, and the windows before it are not vouched for.
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	exec("DELETE FROM " + ident.Table(cfg.Applier.MetaSchema, bypasslog.PositionTable) + " WHERE changefeed = '" + cfg.Changefeed.ID + "'")
	srv = serve(cfg)
	cc = check(1)
	for _, tb := range tables {
		ct := tableResult(cc, tb)
		if ct.GetResult() != "bypass-unwatched" || !strings.Contains(ct.GetBypassNote(), "were not watched") || !strings.Contains(ct.GetBypassNote(), "missing") {
			t.Fatalf("%s after the detector's position was deleted: %v", tb, ct)
		}
	}
	if cc = check(0, "--full-tables", db+".*"); !cc.GetPassed() {
		t.Fatalf("cutover check comparing every table whole: %v", cc)
	}

	// (b) Bypass detection off.
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	off := cfg
	off.Bypass.Enabled = false
	serve(off)
	cc = check(1)
	if cc.GetBypass() != "off" {
		t.Fatalf("bypass %q, want off", cc.GetBypass())
	}
	for _, tb := range tables {
		if ct := tableResult(cc, tb); ct.GetResult() != "bypass-unwatched" || ct.GetBypass() != "off" ||
			!slices.ContainsFunc(cc.GetFailures(), func(f string) bool {
				return strings.HasPrefix(f, tb+": bypass-unwatched") && strings.Contains(f, "bypass detection is off")
			}) {
			t.Fatalf("%s with bypass detection off: %v (failures %q)", tb, ct, cc.GetFailures())
		}
	}
	if cc = check(0, "--full"); !cc.GetPassed() {
		t.Fatalf("cutover check --full with bypass detection off: %v", cc)
	}
	for _, tb := range tables {
		if !tableResult(cc, tb).GetFull() {
			t.Errorf("%s not compared whole under --full", tb)
		}
	}
}

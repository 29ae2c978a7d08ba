package verify

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/rowkey"
	"github.com/tidb-parity/parity/internal/testenv"
)

// ledgerMeta stands in for the applier's side of the dirty-key ledger contract
// (internal/ledger) in the fixture's meta schema, as checker's tests do: verify must not
// import cdc. cmd/parity's tests run the real applier.
type ledgerMeta struct {
	db         *sql.DB
	schema, cf string
}

func newLedgerMeta(t *testing.T, f *fixture, cf string) *ledgerMeta {
	t.Helper()
	m := &ledgerMeta{db: f.down, schema: f.meta, cf: cf}
	q := func(s string) string { return strings.ReplaceAll(s, "%s", ident.Quote(f.meta)) }
	for _, stmt := range []string{
		q("CREATE DATABASE IF NOT EXISTS %s"),
		q(`CREATE TABLE %s.` + ledger.Table + ` (changefeed VARCHAR(128) NOT NULL, max_ts BIGINT UNSIGNED NOT NULL,
			schema_name VARCHAR(64) NOT NULL, table_name VARCHAR(64) NOT NULL, part INT NOT NULL,
			min_ts BIGINT UNSIGNED NOT NULL, key_count INT NOT NULL, entries LONGBLOB NOT NULL,
			PRIMARY KEY (changefeed, max_ts, schema_name, table_name, part))`),
		q(`CREATE TABLE %s.` + ledger.RangeTable + ` (changefeed VARCHAR(128) NOT NULL PRIMARY KEY, since_ts BIGINT UNSIGNED NOT NULL)`),
		q(`CREATE TABLE %s.` + ledger.CheckpointTable + ` (changefeed VARCHAR(128) NOT NULL PRIMARY KEY, applied_ts BIGINT UNSIGNED NOT NULL)`),
		q(`CREATE TABLE %s.` + ledger.TSMapTable + ` (changefeed VARCHAR(128) NOT NULL, upstream_ts BIGINT UNSIGNED NOT NULL,
			downstream_pos TEXT NOT NULL, wall_time TIMESTAMP(6) NOT NULL, source VARCHAR(32) NOT NULL,
			PRIMARY KEY (changefeed, upstream_ts))`),
	} {
		f.exec(t, f.down, stmt)
	}
	return m
}

func (m *ledgerMeta) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := m.db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// since records where the ledger starts; applied the applier's checkpoint.
func (m *ledgerMeta) since(t *testing.T, ts uint64) {
	m.exec(t, "REPLACE INTO "+ident.Table(m.schema, ledger.RangeTable)+" VALUES (?, ?)", m.cf, ts)
}

func (m *ledgerMeta) applied(t *testing.T, ts uint64) {
	m.exec(t, "REPLACE INTO "+ident.Table(m.schema, ledger.CheckpointTable)+" VALUES (?, ?)", m.cf, ts)
}

// changed records an applier round ending at maxTs that changed row id of
// schema.table at commitTs.
func (m *ledgerMeta) changed(t *testing.T, schema, table string, id int64, commitTs, maxTs uint64) {
	t.Helper()
	k, err := rowkey.Encode(id)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := ledger.Encode([]ledger.Entry{{Key: k, CommitTs: commitTs}}, commitTs)
	if err != nil {
		t.Fatal(err)
	}
	m.exec(t, "INSERT INTO "+ident.Table(m.schema, ledger.Table)+" VALUES (?, ?, ?, ?, 0, ?, 1, ?)", m.cf, maxTs, schema, table, commitTs, blob)
}

// TestCutoverCheck: the cutover gate on the real TiDB and fallback, with the ledger
// written as the applier writes it and the applier stand-in moved as replication
// would move it.
//   - A table without a clean full verification fails the check before anything is
//     verified (no-full-diff); the table with one names it.
//   - With a clean full run, a row changed on both sides afterwards (in the ledger): the
//     check waits for the TSO, runs one cutover-check run scoped since the full run's
//     pair, at a pair at or after the TSO, verifies exactly that key and passes; the run
//     is in the history and the stats under its trigger.
//   - A full run older than MaxFullAge fails it (full-diff-too-old), a TSO never applied
//     times out.
//   - A row whose change reached the fallback wrong (diverged after the full run) fails
//     it with that difference and its class; Differences and FixSQL of the run return
//     it (the fix SQL is the checker's, REPLACE of TiDB's row).
func TestCutoverCheck(t *testing.T) {
	f := newFixture(t, 200, 50)
	cfg := f.config()
	lm := newLedgerMeta(t, f, cfg.Changefeed)
	lm.since(t, f.ts)
	lm.applied(t, f.ts)
	app := &movingApplier{}
	app.ts.Store(f.ts)
	s, err := New(cfg, Deps{Applier: app, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	ctx := ctxMinute(t)
	t1, t2 := f.db+".t1", f.db+".t2"

	full := manual(t, s, Request{Tables: []string{t1}})
	if full.Result != ResultEqual || full.FirstTS != f.ts {
		t.Fatalf("full run: %+v", full)
	}

	// t2 was never verified in full.
	res, err := s.CutoverCheck(ctx, CutoverRequest{UpstreamTS: f.ts})
	if err != nil {
		t.Fatal(err)
	}
	if res.Passed || res.RunID != "" || len(res.Tables) != 2 || res.Tables[0].Table != t1 || res.Tables[0].LastFullRunID != full.RunID ||
		res.Tables[0].SinceTS != f.ts || res.Tables[1].Table != t2 || res.Tables[1].Result != CutoverNoFullDiff ||
		len(res.Failures) != 1 || !strings.Contains(res.Failures[0], t2+": no clean full verification") {
		t.Fatalf("check without a full run of t2: %+v", res)
	}

	// Replication changes row 5 on both sides after the full run.
	for _, db := range []*sql.DB{f.up, f.down} {
		f.exec(t, db, "UPDATE "+ident.Table(f.db, "t1")+" SET v='changed 5' WHERE id=5")
	}
	ts2 := testenv.TiDBTSO(t, f.up)
	lm.changed(t, f.db, "t1", 5, ts2-1, ts2)
	lm.applied(t, ts2)
	go func() {
		time.Sleep(300 * time.Millisecond)
		app.ts.Store(ts2) // the check waits for it
	}()
	res, err = s.CutoverCheck(ctx, CutoverRequest{UpstreamTS: ts2, Tables: []string{t1}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Passed || len(res.Failures) != 0 || res.UpstreamTS != ts2 || res.Pair.TS < ts2 || !strings.HasPrefix(res.Pair.Position, "mariadb-gtid:") ||
		res.Pair.Source != "gtid_binlog_pos" || res.RunID == "" || res.KeysVerified != 1 || res.Waited < 200*time.Millisecond || len(res.Tables) != 1 {
		t.Fatalf("check after a replicated change: %+v", res)
	}
	if ct := res.Tables[0]; ct.Table != t1 || ct.LastFullRunID != full.RunID || ct.SinceTS != f.ts || ct.KeysVerified != 1 || ct.Result != ResultEqual || ct.LastFullAge <= 0 {
		t.Fatalf("t1's evidence: %+v", ct)
	}
	h := recordOf(t, s, res.RunID)
	if h.Trigger != TriggerCutoverCheck || h.TriggerKind != TriggerCutoverCheck || h.Scope != "since:"+strconv.FormatUint(f.ts, 10) || h.Result != ResultEqual || h.FirstTS != res.Pair.TS {
		t.Fatalf("the check's run in the history: %+v", h)
	}
	found := false
	for _, c := range s.Stats().Runs {
		found = found || c == RunCount{TriggerCutoverCheck, ResultEqual, 1}
	}
	if !found {
		t.Fatalf("stats: %+v", s.Stats().Runs)
	}
	if runs, err := s.List(ctx, ListFilter{Trigger: TriggerCutoverCheck}); err != nil || len(runs) != 1 || runs[0].RunID != res.RunID {
		t.Fatalf("List of cutover checks: %v %v", runIDs(runs), err)
	}

	// Too old a full run; a TSO never applied.
	res, err = s.CutoverCheck(ctx, CutoverRequest{UpstreamTS: ts2, Tables: []string{t1}, MaxFullAge: time.Millisecond})
	if err != nil || res.Passed || res.RunID != "" || res.Tables[0].Result != CutoverFullDiffTooOld || len(res.Failures) != 1 || !strings.Contains(res.Failures[0], "more than 1ms") {
		t.Fatalf("check with max full age 1ms: %+v %v", res, err)
	}
	if _, err := s.CutoverCheck(ctx, CutoverRequest{UpstreamTS: ts2 + 1<<18, Tables: []string{t1}, WaitTimeout: 300 * time.Millisecond}); !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "not applied within") {
		t.Fatalf("check at a TSO never applied: %v", err)
	}
	for _, bad := range []struct {
		req   CutoverRequest
		field string
	}{
		{CutoverRequest{}, FieldUpstreamTS}, {CutoverRequest{UpstreamTS: ts2, Now: true}, FieldUpstreamTS},
		{CutoverRequest{Now: true, Tables: []string{"nodot"}}, FieldTables}, {CutoverRequest{Now: true, MaxFullAge: -1}, FieldMaxFullAge},
		{CutoverRequest{Now: true, WaitTimeout: -1}, FieldWaitTimeout},
	} {
		_, err := s.CutoverCheck(ctx, bad.req)
		var re *RequestError
		if !errors.Is(err, ErrInvalidRequest) || !errors.As(err, &re) || re.Field != bad.field {
			t.Errorf("CutoverCheck(%+v): %v (%+v), want an invalid request about %s", bad.req, err, re, bad.field)
		}
	}

	// Row 6's change reaches the fallback wrong; the check asks for TiDB's TSO now.
	f.exec(t, f.up, "UPDATE "+ident.Table(f.db, "t1")+" SET v='changed 6' WHERE id=6")
	f.exec(t, f.down, "UPDATE "+ident.Table(f.db, "t1")+" SET v='wrong 6' WHERE id=6")
	ts3 := testenv.TiDBTSO(t, f.up)
	lm.changed(t, f.db, "t1", 6, ts3-1, ts3)
	moved := make(chan error, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		ts4, err := s.UpstreamTSO(ctx) // after the check's own TSO
		if err == nil {
			_, err = f.down.Exec("REPLACE INTO "+ident.Table(lm.schema, ledger.CheckpointTable)+" VALUES (?, ?)", lm.cf, ts4)
		}
		if err == nil {
			app.ts.Store(ts4)
		}
		moved <- err
	}()
	res, err = s.CutoverCheck(ctx, CutoverRequest{Now: true, Tables: []string{t1}, WaitTimeout: 30 * time.Second})
	if merr := <-moved; merr != nil {
		t.Fatal(merr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if res.Passed || res.UpstreamTS <= ts3 || res.KeysVerified != 2 || len(res.Differences) != 1 || len(res.Failures) != 1 || res.Failures[0] != t1+": 1 differences" {
		t.Fatalf("check after a divergence: %+v", res)
	}
	d := res.Differences[0]
	var classified int64
	for _, n := range res.ByClass {
		classified += n
	}
	if d.UpTable != "t1" || d.Kind != checker.Differing || d.Key != "id=6" || d.Class == "" || classified != 1 || res.ByClass[d.Class] != 1 {
		t.Fatalf("the divergence: %+v, by class %v", d, res.ByClass)
	}
	t.Logf("the divergence is classified %s", d.Class)
	if ct := res.Tables[0]; ct.Result != ResultDifferent || ct.Differences != 1 || ct.KeysVerified != 2 {
		t.Fatalf("t1's evidence: %+v", ct)
	}
	ds, err := s.Differences(ctx, res.RunID, []string{f.db + ".t*"})
	if err != nil || len(ds) != 1 || ds[0].Key != "id=6" || len(ds[0].Columns) != 1 || ds[0].Columns[0] != "v" {
		t.Fatalf("Differences: %+v %v", ds, err)
	}
	if _, err := s.Differences(ctx, res.RunID, []string{t2}); !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "not among the tables") {
		t.Fatalf("Differences of a table not in the run: %v", err)
	}
	if _, err := s.Differences(ctx, "v-none", nil); !errors.Is(err, ErrRunNotFound) {
		t.Fatalf("Differences of an unknown run: %v", err)
	}
	var fix strings.Builder
	err = s.FixSQL(ctx, res.RunID, nil, func(table, sql string) error {
		if table != t1 || !strings.HasSuffix(sql, ";\n") {
			t.Errorf("fix SQL chunk for %q: %q", table, sql)
		}
		fix.WriteString(sql)
		return nil
	})
	want := "REPLACE INTO " + ident.Table(f.db, "t1") + " (`id`, `v`) VALUES (6, 'changed 6');\n"
	if err != nil || !strings.HasPrefix(fix.String(), "-- parity diff run ") || !strings.HasSuffix(fix.String(), want) {
		t.Fatalf("fix SQL: %q %v", fix.String(), err)
	}
	// Differences of the clean full run: none; of a run that never stored any: none.
	if ds, err := s.Differences(ctx, full.RunID, nil); err != nil || len(ds) != 0 {
		t.Fatalf("Differences of a clean run: %+v %v", ds, err)
	}
}

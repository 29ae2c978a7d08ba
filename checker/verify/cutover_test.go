package verify

import (
	"context"
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/bypasslog"
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

// detectorStandIn stands in for the bypass detector (cdc/bypass.Detector, which verify
// must not import; cmd/parity's tests run the real one): it vouches for every write
// since since, whose records a test writes into bypass_writes as the detector does
// (bypassMeta).
type detectorStandIn struct {
	mu    sync.Mutex
	since time.Time
	err   error
}

func (d *detectorStandIn) Cover(context.Context) (bypasslog.Coverage, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.err != nil {
		return bypasslog.Coverage{}, d.err
	}
	return bypasslog.Coverage{Since: d.since, Reason: "first start", Through: time.Now()}, nil
}

func (d *detectorStandIn) set(since time.Time, err error) {
	d.mu.Lock()
	d.since, d.err = since, err
	d.mu.Unlock()
}

// detected records, as the detector records them (internal/bypasslog's contract), a
// write straight into the fallback: kind on row id of schema.table, or a DDL (kind ddl,
// id ignored, text the statement).
func detected(t *testing.T, f *fixture, cf, schema, table, kind string, id int64, text string) {
	t.Helper()
	q := func(s string) string { return strings.ReplaceAll(s, "%s", ident.Quote(f.meta)) }
	f.exec(t, f.down, q(`CREATE TABLE IF NOT EXISTS %s.`+bypasslog.WritesTable+` (changefeed VARCHAR(128) NOT NULL, binlog_file VARCHAR(255) NOT NULL,
		binlog_pos BIGINT UNSIGNED NOT NULL, seq INT NOT NULL, gtid VARCHAR(255) NOT NULL, server_id INT UNSIGNED NOT NULL,
		event_time DATETIME(6) NOT NULL, detected_at DATETIME(6) NOT NULL, schema_name VARCHAR(64) NOT NULL, table_name VARCHAR(64) NOT NULL,
		kind VARCHAR(16) NOT NULL, key_columns TEXT NOT NULL, key_values LONGBLOB NOT NULL, key_text TEXT NOT NULL,
		PRIMARY KEY (changefeed, binlog_file, binlog_pos, seq))`))
	cols, vals := `[]`, []byte("null")
	if kind != bypasslog.KindDDL {
		cols = `["id"]`
		var err error
		if vals, err = bypasslog.EncodeValues([][]byte{[]byte(strconv.FormatInt(id, 10))}); err != nil {
			t.Fatal(err)
		}
		text = "id=" + strconv.FormatInt(id, 10)
	}
	now := time.Now().UTC().Format(bypasslog.TimeFormat)
	pos := time.Now().UnixNano()
	if _, err := f.down.Exec(q(`INSERT INTO %s.`+bypasslog.WritesTable+` VALUES (?, 'bin.000001', ?, 0, '0-1-1', 1, ?, ?, ?, ?, ?, ?, ?, ?)`),
		cf, pos, now, now, schema, table, kind, cols, vals, text); err != nil {
		t.Fatal(err)
	}
}

// cutoverFixture is a running service over a fixture of 200 rows with the ledger's
// stand-in starting at the fixture's TSO, an applier stand-in there, and a detector
// stand-in watching since an hour ago.
func cutoverFixture(t *testing.T) (*fixture, Config, *ledgerMeta, *movingApplier, *detectorStandIn, *Service) {
	t.Helper()
	f := newFixture(t, 200, 50)
	cfg := f.config()
	lm := newLedgerMeta(t, f, cfg.Changefeed)
	lm.since(t, f.ts)
	lm.applied(t, f.ts)
	app := &movingApplier{}
	app.ts.Store(f.ts)
	det := &detectorStandIn{since: time.Now().Add(-time.Hour)}
	s, err := New(cfg, Deps{Applier: app, Bypass: det, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	return f, cfg, lm, app, det, s
}

// TestCutoverCheckBypass: the gate's second source of keys and its refusal of windows
// nobody watched, on the real TiDB and fallback.
//   - A row of a table the changefeed never touched since the full run, changed straight
//     in the fallback and recorded by the detector: the check verifies its key, finds it
//     different with class bypass, and fails naming it; once it is put back, it passes
//     and says the key came from the detector.
//   - Bypass detection watching only since after the full run, or unable to vouch, or
//     off: the check does not pass (bypass-unwatched, naming the window and the gap),
//     however equal the data; with a full comparison of the table it passes.
//   - A DDL made straight in the fallback: the check fails naming the table.
func TestCutoverCheckBypass(t *testing.T) {
	f, cfg, lm, app, det, s := cutoverFixture(t)
	ctx := ctxMinute(t)
	t1 := f.db + ".t1"
	full := manual(t, s, Request{Tables: []string{t1}})
	if full.Result != ResultEqual {
		t.Fatalf("full run: %+v", full)
	}
	check := func(req CutoverRequest) CutoverResult {
		t.Helper()
		req.Tables = []string{t1}
		ts := testenv.TiDBTSO(t, f.up)
		lm.applied(t, ts)
		app.ts.Store(ts)
		req.UpstreamTS = ts
		res, err := s.CutoverCheck(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}

	// Nothing changed through the changefeed; row 7 changed straight in the fallback.
	f.exec(t, f.down, "UPDATE "+ident.Table(f.db, "t1")+" SET v='bypass 7' WHERE id=7")
	detected(t, f, cfg.Changefeed, f.db, "t1", bypasslog.KindUpdate, 7, "")
	res := check(CutoverRequest{})
	if res.Passed || res.Bypass != "on" || len(res.Differences) != 1 || res.Differences[0].Key != "id=7" || res.Differences[0].Class != checker.ClassBypass ||
		len(res.Failures) != 1 || res.Failures[0] != t1+": 1 differences" {
		t.Fatalf("check after a write straight into the fallback: %+v", res)
	}
	if ct := res.Tables[0]; ct.Result != ResultDifferent || ct.Bypass != checker.BypassIncluded || ct.BypassKeys != 1 || ct.LedgerKeys != 0 || ct.KeysVerified != 1 ||
		ct.LedgerFromTS != full.FirstTS || ct.LedgerUntilTS != res.Pair.TS || ct.BypassSince.IsZero() {
		t.Fatalf("t1's evidence: %+v", ct)
	}
	var v string
	if err := f.up.QueryRow("SELECT v FROM " + ident.Table(f.db, "t1") + " WHERE id=7").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if _, err := f.down.Exec("UPDATE "+ident.Table(f.db, "t1")+" SET v=? WHERE id=7", v); err != nil { // put back (as a repair would)
		t.Fatal(err)
	}
	if res = check(CutoverRequest{}); !res.Passed || res.Tables[0].BypassKeys != 1 || res.Tables[0].Bypass != checker.BypassIncluded {
		t.Fatalf("check once the row is put back: %+v", res)
	}

	// Watched only since after the full run: not vouched for, however equal.
	det.set(time.Now(), nil)
	res = check(CutoverRequest{})
	if res.Passed || res.Tables[0].Result != CutoverBypassUnwatched || len(res.Failures) != 1 ||
		!strings.Contains(res.Failures[0], t1+": bypass-unwatched") || !strings.Contains(res.Failures[0], "were not watched") ||
		!strings.Contains(res.Failures[0], "--full-tables "+t1) {
		t.Fatalf("check with a gap in bypass detection: %+v", res)
	}
	// A detector that cannot vouch (behind, stopped).
	det.set(time.Now().Add(-time.Hour), errors.New("the bypass detector has not read the fallback's binlog up to its end (state reconnecting)"))
	res = check(CutoverRequest{})
	if res.Passed || res.Tables[0].Result != CutoverBypassUnwatched || !strings.Contains(res.Failures[0], "state reconnecting") {
		t.Fatalf("check with a detector that cannot vouch: %+v", res)
	}
	// A full comparison of the table is the way out.
	res = check(CutoverRequest{FullTables: []string{f.db + ".t*"}})
	if !res.Passed || !res.Tables[0].Full || res.Tables[0].KeysVerified != 200 {
		t.Fatalf("check comparing t1 whole: %+v", res)
	}
	det.set(time.Now().Add(-time.Hour), nil)

	// A DDL straight in the fallback.
	detected(t, f, cfg.Changefeed, f.db, "t1", bypasslog.KindDDL, 0, "ALTER TABLE t1 ADD INDEX (v)")
	res = check(CutoverRequest{})
	if res.Passed || res.Tables[0].Result != CutoverBypassDDL || len(res.Failures) != 1 || !strings.Contains(res.Failures[0], t1+": bypass-ddl") ||
		!strings.Contains(res.Failures[0], "ALTER TABLE t1 ADD INDEX (v)") {
		t.Fatalf("check after a DDL straight in the fallback: %+v", res)
	}

	// Bypass detection off: no table can pass by keys; compared whole, it passes.
	off, err := New(cfg, Deps{Applier: app, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, off)
	s = off
	res = check(CutoverRequest{})
	if res.Passed || res.Bypass != "off" || res.Tables[0].Result != CutoverBypassUnwatched || res.Tables[0].Bypass != checker.BypassOff ||
		!strings.Contains(res.Failures[len(res.Failures)-1], "bypass detection is off") {
		t.Fatalf("check with bypass detection off: %+v", res)
	}
	if res = check(CutoverRequest{Full: true}); !res.Passed || !res.Tables[0].Full {
		t.Fatalf("check with bypass detection off, compared whole: %+v", res)
	}
	// A scoped run may complete without a detector; its history says the writes that
	// bypassed parity were not among its keys.
	cdc := manual(t, off, Request{Scope: ScopeCDC, Tables: []string{t1}})
	if h := recordOf(t, off, cdc.RunID); h.Result != ResultEqual || len(h.Tables) != 1 || h.Tables[0].Scope != "keys" || h.Tables[0].Bypass != checker.BypassOff ||
		!strings.Contains(h.Tables[0].BypassNote, "bypass detection is off") {
		t.Fatalf("a cdc-scoped run without a detector, in the history: %+v", h)
	}
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
	f, _, lm, app, _, s := cutoverFixture(t)
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

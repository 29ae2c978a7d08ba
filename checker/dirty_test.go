package checker

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// changefeedMeta stands in for the applier's side of the ledger contract
// (internal/ledger) in a meta schema: its tables as the contract lays them out, and rows
// written as the applier writes them. The checker must not import cdc, so its tests
// write the contract's rows themselves; cmd/parity's tests run the real applier.
type changefeedMeta struct {
	db         *sql.DB
	schema, cf string
}

func newChangefeedMeta(t *testing.T, db *sql.DB, schema, cf string) *changefeedMeta {
	t.Helper()
	q := func(s string) string { return strings.ReplaceAll(s, "%s", ident.Quote(schema)) }
	exec(t, db, q("CREATE DATABASE IF NOT EXISTS %s"),
		q(`CREATE TABLE %s.`+ledger.Table+` (changefeed VARCHAR(128) NOT NULL, max_ts BIGINT UNSIGNED NOT NULL,
			schema_name VARCHAR(64) NOT NULL, table_name VARCHAR(64) NOT NULL, part INT NOT NULL,
			min_ts BIGINT UNSIGNED NOT NULL, key_count INT NOT NULL, entries LONGBLOB NOT NULL,
			PRIMARY KEY (changefeed, max_ts, schema_name, table_name, part))`),
		q(`CREATE TABLE %s.`+ledger.RangeTable+` (changefeed VARCHAR(128) NOT NULL PRIMARY KEY, since_ts BIGINT UNSIGNED NOT NULL)`),
		q(`CREATE TABLE %s.`+ledger.CheckpointTable+` (changefeed VARCHAR(128) NOT NULL PRIMARY KEY, applied_ts BIGINT UNSIGNED NOT NULL)`),
		q(`CREATE TABLE %s.`+ledger.TSMapTable+` (changefeed VARCHAR(128) NOT NULL, upstream_ts BIGINT UNSIGNED NOT NULL,
			downstream_pos TEXT NOT NULL, wall_time TIMESTAMP(6) NOT NULL, source VARCHAR(32) NOT NULL,
			PRIMARY KEY (changefeed, upstream_ts))`))
	t.Cleanup(func() { _, _ = db.Exec(q("DROP DATABASE IF EXISTS %s")) })
	return &changefeedMeta{db: db, schema: schema, cf: cf}
}

func (m *changefeedMeta) table(name string) string { return ident.Table(m.schema, name) }

// since records where the ledger starts.
func (m *changefeedMeta) since(t *testing.T, ts uint64) {
	t.Helper()
	m.exec(t, "REPLACE INTO "+m.table(ledger.RangeTable)+" VALUES (?, ?)", m.cf, ts)
}

// applied records the applier's checkpoint.
func (m *changefeedMeta) applied(t *testing.T, ts uint64) {
	t.Helper()
	m.exec(t, "REPLACE INTO "+m.table(ledger.CheckpointTable)+" VALUES (?, ?)", m.cf, ts)
}

// tsMap records that at wall the fallback held the upstream at ts.
func (m *changefeedMeta) tsMap(t *testing.T, ts uint64, wall time.Time) {
	t.Helper()
	m.exec(t, "INSERT INTO "+m.table(ledger.TSMapTable)+" VALUES (?, ?, '', ?, 'interval')", m.cf, ts, wall.UTC().Format("2006-01-02 15:04:05.000000"))
}

// round records one applier round ending at maxTs that changed the given keys of the
// upstream table schema.table (each key with its commit ts).
func (m *changefeedMeta) round(t *testing.T, schema, table string, maxTs uint64, es ...ledger.Entry) {
	t.Helper()
	es = ledger.Compact(es)
	minTs := es[0].CommitTs
	for _, e := range es {
		minTs = min(minTs, e.CommitTs)
	}
	blob, err := ledger.Encode(es, minTs)
	if err != nil {
		t.Fatal(err)
	}
	m.exec(t, "INSERT INTO "+m.table(ledger.Table)+" VALUES (?, ?, ?, ?, 0, ?, ?, ?)", m.cf, maxTs, schema, table, minTs, len(es), blob)
}

func (m *changefeedMeta) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := m.db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// heldBarrier is a Barrierer for a fallback nothing replicates into: it is always held.
type heldBarrier struct{}

func (heldBarrier) Barrier(ctx context.Context, _ uint64, fn func(context.Context) error) error {
	return fn(ctx)
}

// scopeRun runs a diff at a snapshot pair at ts of tables, with scope, on the changefeed
// meta schema meta (which holds the run state too).
func scopeRun(t *testing.T, p pair, meta *changefeedMeta, ts uint64, scope string, tables ...string) (*Report, Config, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kill, err := sql.Open("mysql", p.down.Root)
	if err != nil {
		t.Fatal(err)
	}
	defer kill.Close()
	pr, err := OpenSnapshotPair(ctx, heldBarrier{}, SnapshotPairConfig{TS: ts, UpstreamDSN: p.up.DSN, Downstream: p.down.DB, Kill: kill})
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	cfg := p.config(t, tables...)
	cfg.MetaSchema = meta.schema
	cfg.Changefeed = ChangefeedConfig{ID: meta.cf, MetaSchema: meta.schema}
	cfg.Scope = scope
	src := pr.Sources
	src.Meta = p.down.DB
	rep, err := NewDiff(cfg, &src).Run(ctx)
	return rep, cfg, err
}

// classes returns "key=class" of a table's reported differences, sorted.
func classes(tr TableReport) []string {
	var out []string
	for _, d := range tr.Differences {
		var ks []string
		for _, kv := range d.Key {
			ks = append(ks, kv.Value)
		}
		out = append(out, string(d.Kind)+" "+strings.Join(ks, ",")+"="+d.Class)
	}
	slices.Sort(out)
	return out
}

func sameStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %q\n want %q", what, got, want)
	}
}

// TestScopesAndClasses, on the real TiDB and fallback at snapshot pairs, with a ledger
// written as the applier writes it (keys typed and ordered as TiCDC's messages carry
// them: a composite primary key (d, e) listed in table order (e, d), the ENUM as its
// member index), a ts-map by which the applier caught up at U, and divergences written
// straight into the fallback on rows the changefeed never changed, changed before U and
// changed after it:
//   - a full run finds every divergence, each with its class (imported, post-import, cdc;
//     the keyless table's unclassified), and records the table found equal as verified;
//   - a since: run reads only the keys the ledger has after that point (rows compared =
//     keys), finds the divergences among them and none outside, and compares the keyless
//     table whole, saying so;
//   - a cdc run is refused for tables never verified clean, and a since: run starting
//     before the ledger does is refused, both before reading anything;
//   - once the table is repaired and verified clean at a pair, a cdc run reads only the
//     keys changed since, and finds the divergence among them.
func TestScopesAndClasses(t *testing.T) {
	p := tidbPair(t)
	meta := newChangefeedMeta(t, p.down.DB, testenv.UniqueName("pm"), "cf")
	p.both(t,
		"CREATE TABLE kv (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(32) NOT NULL)",
		"CREATE TABLE ck (e ENUM('a','it''s','b\\\\c') NOT NULL, d DECIMAL(10,2) NOT NULL, v INT, PRIMARY KEY (d, e))",
		"CREATE TABLE nokey (a INT, b VARCHAR(8))",
		"CREATE TABLE clean (id INT NOT NULL PRIMARY KEY)")
	p.fill(t, "kv", 1000, func(i int) string { return fmt.Sprintf("(%d, 'v%d')", i, i) })
	p.fill(t, "clean", 10, func(i int) string { return fmt.Sprintf("(%d)", i) })
	p.both(t, "INSERT INTO ck VALUES ('a', 1.50, 1), ('it''s', 1.50, 2), ('b\\\\c', -2.00, 3), ('a', 3.00, 4)",
		"INSERT INTO nokey VALUES (1, 'x'), (2, 'y')")
	up := p.up.Name
	now := time.Now()
	t0 := tso.FromTime(now.Add(-20 * time.Minute)) // the import: the ledger starts here
	u := tso.FromTime(now.Add(-10 * time.Minute))  // the applier caught up here
	meta.since(t, t0)
	meta.tsMap(t, t0+1000, tso.Time(t0).Add(5*time.Minute)) // 5 min behind
	meta.tsMap(t, u, tso.Time(u).Add(2*time.Second))        // within 30 s
	meta.tsMap(t, u+1000, tso.Time(u).Add(3*time.Second))
	var es []ledger.Entry
	for id := int64(1); id <= 60; id++ {
		es = append(es, ledger.Entry{Key: key(t, id), CommitTs: t0 + uint64(id)})
	}
	meta.round(t, up, "kv", t0+100, es...)
	es = nil
	for id := int64(61); id <= 100; id++ {
		es = append(es, ledger.Entry{Key: key(t, id), CommitTs: u + uint64(id)})
	}
	es = append(es, ledger.Entry{Key: key(t, int64(5)), CommitTs: t0 + 200}) // 5 changed again, still before U
	meta.round(t, up, "kv", u+100, es...)
	// ck's keys in table order (e, d), the ENUM as its index: ('it''s', 1.50) after U,
	// ('a', 3.00) before.
	meta.round(t, up, "ck", t0+50, ledger.Entry{Key: key(t, uint64(1), "3.00"), CommitTs: t0 + 40})
	meta.round(t, up, "ck", u+50, ledger.Entry{Key: key(t, uint64(2), "1.50"), CommitTs: u + 45})

	// Divergences straight into the fallback.
	exec(t, p.down.DB,
		"UPDATE kv SET v = 'changed' WHERE id = 5", // post-import
		"DELETE FROM kv WHERE id = 70",             // cdc
		"UPDATE kv SET v = 'changed' WHERE id = 500",
		"INSERT INTO kv VALUES (2000, 'extra')",               // imported
		"UPDATE ck SET v = 20 WHERE e = 'it''s' AND d = 1.50", // cdc
		"DELETE FROM ck WHERE e = 'a' AND d = 3.00",           // post-import
		"INSERT INTO nokey VALUES (3, 'z')")
	ts := testenv.TiDBTSO(t, p.up.DB)
	meta.applied(t, ts)

	// A full run at the pair: every divergence, with its class.
	rep, cfg, err := scopeRun(t, p, meta, ts, "full", "kv", "ck", "nokey", "clean")
	if err != nil {
		t.Fatal(err)
	}
	sameStrings(t, "kv", classes(tableReport(t, rep, "kv")), []string{
		"differing 5=post-import", "missing 70=cdc", "differing 500=imported", "extra 2000=imported"})
	sameStrings(t, "ck", classes(tableReport(t, rep, "ck")), []string{
		"differing 1.50,_utf8mb4 X'69742773'=cdc", "missing 3.00,'a'=post-import"})
	sameStrings(t, "nokey", classes(tableReport(t, rep, "nokey")), []string{"extra 3,'z'=unclassified"})
	want := map[string]int64{ClassImported: 2, ClassPostImport: 2, ClassCDC: 2, ClassUnclassified: 1}
	if !maps.Equal(rep.DifferencesByClass, want) {
		t.Errorf("differences by class %v, want %v", rep.DifferencesByClass, want)
	}
	if c := rep.Classification; c == nil || c.AtTs != ts || c.LedgerSinceTs != t0 || c.CaughtUpTs != u {
		t.Errorf("classification %+v, want at %d, ledger since %d, caught up %d", c, ts, t0, u)
	}
	if tr := tableReport(t, rep, "kv"); tr.Scope != "full" || tr.RowsChecked != 1000 {
		t.Errorf("kv in a full run: scope %q, %d rows", tr.Scope, tr.RowsChecked)
	}
	// report.json carries each difference's class and the counts.
	data, err := os.ReadFile(filepath.Join(cfg.OutputDir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var js struct {
		Scope  string           `json:"scope"`
		Counts map[string]int64 `json:"differences_by_class"`
		Tables []struct {
			Table       string `json:"table"`
			Differences []struct {
				Class string `json:"class"`
			} `json:"differences"`
		} `json:"tables"`
	}
	if err := json.Unmarshal(data, &js); err != nil || js.Scope != "full" || !maps.Equal(js.Counts, want) {
		t.Errorf("report.json: %v, scope %q, counts %v", err, js.Scope, js.Counts)
	}
	for _, tb := range js.Tables {
		for _, d := range tb.Differences {
			if d.Class == "" {
				t.Errorf("report.json: a difference of %s without a class", tb.Table)
			}
		}
	}
	// The one equal table is verified at the pair; the others are not.
	vs, err := Verifications(context.Background(), p.down.DB, meta.schema, "cf")
	if err != nil || len(vs) != 1 || vs[0].Table != "clean" || vs[0].Ts != ts || vs[0].Schema != up || vs[0].RunID != rep.RunID {
		t.Fatalf("verifications %+v, %v", vs, err)
	}

	// since: the keys the ledger has after t0: kv's 100 rows, ck's 2; the keyless table
	// whole; clean has none.
	rep, _, err = scopeRun(t, p, meta, ts, fmt.Sprintf("since:%d", t0), "kv", "ck", "nokey", "clean")
	if err != nil {
		t.Fatal(err)
	}
	kv := tableReport(t, rep, "kv")
	sameStrings(t, "kv since", classes(kv), []string{"differing 5=post-import", "missing 70=cdc"})
	if kv.Scope != "keys" || kv.ScopeKeys != 100 || kv.RowsChecked != 100 || kv.DownstreamRows != 99 || kv.ScopeFromTs != t0 || kv.ScopeUntilTs != ts {
		t.Errorf("kv since: scope %q, %d keys in (%d, %d], %d/%d rows compared", kv.Scope, kv.ScopeKeys, kv.ScopeFromTs, kv.ScopeUntilTs, kv.RowsChecked, kv.DownstreamRows)
	}
	ck := tableReport(t, rep, "ck")
	sameStrings(t, "ck since", classes(ck), []string{"differing 1.50,_utf8mb4 X'69742773'=cdc", "missing 3.00,'a'=post-import"})
	if ck.ScopeKeys != 2 || ck.RowsChecked != 2 || ck.DownstreamRows != 1 {
		t.Errorf("ck since: %d keys, %d/%d rows", ck.ScopeKeys, ck.RowsChecked, ck.DownstreamRows)
	}
	nk := tableReport(t, rep, "nokey")
	sameStrings(t, "nokey since", classes(nk), []string{"extra 3,'z'=unclassified"})
	if nk.Scope != "whole" || !strings.Contains(nk.ScopeNote, "keyless") || nk.RowsChecked != 2 {
		t.Errorf("nokey since: scope %q (%q), %d rows", nk.Scope, nk.ScopeNote, nk.RowsChecked)
	}
	if cl := tableReport(t, rep, "clean"); cl.Scope != "keys" || cl.ScopeKeys != 0 || cl.RowsChecked != 0 || !cl.Equal() {
		t.Errorf("clean since: %+v", cl)
	}
	if rep.Scope != fmt.Sprintf("since:%d", t0) {
		t.Errorf("report scope %q", rep.Scope)
	}

	// Refused before reading: cdc for tables never verified clean, since: before the ledger.
	_, _, err = scopeRun(t, p, meta, ts, "cdc", "kv", "clean")
	if !errors.Is(err, ErrScopeUnavailable) || !strings.Contains(err.Error(), up+".kv: no clean verification") || strings.Contains(err.Error(), ".clean") {
		t.Fatalf("cdc run of a table never verified: %v", err)
	}
	_, _, err = scopeRun(t, p, meta, ts, fmt.Sprintf("since:%d", t0-1), "kv")
	if !errors.Is(err, ErrScopeUnavailable) || !strings.Contains(err.Error(), "before the changefeed's ledger does") {
		t.Fatalf("since: before the ledger: %v", err)
	}

	// Repair kv and verify it clean at a pair: a cdc run from there reads only what
	// changed since.
	exec(t, p.down.DB, "UPDATE kv SET v = 'v5' WHERE id = 5", "INSERT INTO kv VALUES (70, 'v70')",
		"UPDATE kv SET v = 'v500' WHERE id = 500", "DELETE FROM kv WHERE id = 2000")
	ts1 := testenv.TiDBTSO(t, p.up.DB)
	meta.applied(t, ts1)
	if rep, _, err = scopeRun(t, p, meta, ts1, "full", "kv"); err != nil || !rep.Equal {
		t.Fatalf("full run after the repair: %v, equal %v", err, rep != nil && rep.Equal)
	}
	exec(t, p.up.DB, "UPDATE kv SET v = 'new' WHERE id IN (200, 201)")
	exec(t, p.down.DB, "UPDATE kv SET v = 'new' WHERE id = 201", // replicated
		"UPDATE kv SET v = 'lost' WHERE id = 300") // diverged, not changed by the changefeed
	ts2 := testenv.TiDBTSO(t, p.up.DB)
	meta.round(t, up, "kv", ts2-1, ledger.Entry{Key: key(t, int64(200)), CommitTs: ts2 - 2}, ledger.Entry{Key: key(t, int64(201)), CommitTs: ts2 - 2},
		ledger.Entry{Key: key(t, int64(202)), CommitTs: ts1}) // at the verification: not in (ts1, ts2]
	meta.applied(t, ts2)
	rep, _, err = scopeRun(t, p, meta, ts2, "cdc", "kv")
	if err != nil {
		t.Fatal(err)
	}
	kv = tableReport(t, rep, "kv")
	sameStrings(t, "kv cdc", classes(kv), []string{"differing 200=cdc"})
	if kv.ScopeKeys != 2 || kv.RowsChecked != 2 || kv.ScopeFromTs != ts1 || kv.ScopeUntilTs != ts2 {
		t.Errorf("kv cdc: %d keys in (%d, %d], %d rows; want 2 in (%d, %d]", kv.ScopeKeys, kv.ScopeFromTs, kv.ScopeUntilTs, kv.RowsChecked, ts1, ts2)
	}
	if v, ok, err := lastVerification(context.Background(), p.down.DB, meta.schema, "cf", up, "kv"); err != nil || !ok || v.Ts != ts1 {
		t.Errorf("kv verified at %+v, %v, %v; want %d (the cdc run found a difference)", v, ok, err, ts1)
	}
}

// TestScopedRunResumes stops a scoped run at a snapshot pair after its first key units and
// resumes it at a newer pair (as the daemon does when a pair's view grows old): the run
// keeps its window, compares the keys it had not finished, and reports every key once.
func TestScopedRunResumes(t *testing.T) {
	p := tidbPair(t)
	meta := newChangefeedMeta(t, p.down.DB, testenv.UniqueName("pm"), "cf")
	p.both(t, "CREATE TABLE kv (id BIGINT NOT NULL PRIMARY KEY, v VARCHAR(32) NOT NULL)")
	p.fill(t, "kv", 3000, func(i int) string { return fmt.Sprintf("(%d, 'v%d')", i, i) })
	up := p.up.Name
	t0 := tso.FromTime(time.Now().Add(-time.Hour))
	meta.since(t, t0)
	var es []ledger.Entry
	for id := int64(1); id <= 3000; id++ {
		es = append(es, ledger.Entry{Key: key(t, id), CommitTs: t0 + 10 + uint64(id)})
	}
	meta.round(t, up, "kv", t0+5000, es...)
	meta.tsMap(t, t0+1, tso.Time(t0))
	exec(t, p.down.DB, "UPDATE kv SET v = 'x' WHERE id IN (10, 2900)")
	ts := testenv.TiDBTSO(t, p.up.DB)
	meta.applied(t, ts)

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kill, err := sql.Open("mysql", p.down.Root)
	if err != nil {
		t.Fatal(err)
	}
	defer kill.Close()
	scope := fmt.Sprintf("since:%d", t0)
	runAt := func(ts uint64, resume string, stop bool) (*Report, error) {
		pr, err := OpenSnapshotPair(ctx, heldBarrier{}, SnapshotPairConfig{TS: ts, UpstreamDSN: p.up.DSN, Downstream: p.down.DB, Kill: kill})
		if err != nil {
			t.Fatal(err)
		}
		defer pr.Close()
		cfg := p.config(t, "kv")
		cfg.MetaSchema = meta.schema
		cfg.Changefeed = ChangefeedConfig{ID: meta.cf, MetaSchema: meta.schema}
		cfg.Scope, cfg.Resume, cfg.Concurrency = scope, resume, 1
		rctx, stopRun := context.WithCancel(ctx)
		defer stopRun()
		if stop {
			cfg.Progress = func(pg Progress) {
				if pg.ChunksDone >= 2 {
					stopRun()
				}
			}
		}
		src := pr.Sources
		src.Meta = p.down.DB
		return NewDiff(cfg, &src).Run(rctx)
	}
	_, err = runAt(ts, "", true)
	var re *RunError
	if !errors.As(err, &re) || re.State != RunCancelled {
		t.Fatalf("stopped run: %v", err)
	}
	var done int
	if err := p.down.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+ident.Table(meta.schema, "diff_chunks")+" WHERE run_id = ? AND state = 'done'", re.RunID).Scan(&done); err != nil || done < 2 || done >= 6 {
		t.Fatalf("stopped run: %d chunks done (%v), want some of 6", done, err)
	}
	ts2 := testenv.TiDBTSO(t, p.up.DB)
	meta.applied(t, ts2)
	rep, err := runAt(ts2, re.RunID, false)
	if err != nil {
		t.Fatal(err)
	}
	kv := tableReport(t, rep, "kv")
	sameStrings(t, "kv resumed", classes(kv), []string{"differing 10=cdc", "differing 2900=cdc"})
	if kv.ScopeKeys != 3000 || kv.RowsChecked != 3000 || kv.Chunks != 6 || kv.ScopeUntilTs != ts {
		t.Errorf("resumed: %d keys, %d rows in %d chunks, until %d; want 3000 rows in 6 chunks until %d", kv.ScopeKeys, kv.RowsChecked, kv.Chunks, kv.ScopeUntilTs, ts)
	}
}

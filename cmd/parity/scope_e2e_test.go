package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// TestScopesAndClassesEndToEnd (#17 items 4, 5): loadgen imports two sysbench tables and a
// keyless one into the fallback and runs transactions on the real TiDB; the applier starts
// seconds later (it catches up on a backlog, then replicates live) through real Kafka with
// its dirty-key ledger and a ts-map every second. Then:
//   - a cdc-scoped diff is refused: no table was ever verified clean;
//   - a full diff at a snapshot pair under load finds the sides equal and records every
//     table as verified at its TSO T1;
//   - once the load stopped, divergences are written straight into the fallback — an
//     update, a delete and an insert each on imported rows (never changed by the
//     changefeed), on rows last changed while the applier caught up, and on rows last
//     changed during live replication after T1 — and a row into the keyless table;
//   - a full diff at a pair finds exactly those, each with its class (the keyless row
//     unclassified); a since:<import TSO> diff finds exactly the post-import and cdc ones
//     and reads only the ledger's keys; a cdc diff finds exactly the ones changed after
//     T1 and reads only the keys changed since; both compare the keyless table whole.
//
// The classes the test expects come from the ledger and ts-map as the applier wrote them,
// read independently of the checker (ledger.Read, CaughtUp).
func TestScopesAndClassesEndToEnd(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "scope", 3)
	db := testenv.UniqueName("scope")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	const caughtUpLag = 3 * time.Second

	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 2, 2, 2000
		lg.AllTypes = false
		lg.Rate = 100
	})
	importTs := load.ImportTs
	time.Sleep(6 * time.Second) // a backlog the applier catches up on

	cfg := cdc.DefaultConfig()
	cfg.Changefeed.ID = "scopes"
	cfg.Changefeed.Brokers, cfg.Changefeed.Topics = []string{broker}, []string{topic}
	cfg.Changefeed.StartTs = importTs
	cfg.Downstream.DSN = down.Root
	cfg.Applier.MetaSchema = testenv.UniqueName("pm")
	cfg.Applier.SpillDir = t.TempDir()
	cfg.Applier.TSMapInterval = time.Second
	t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(cfg.Applier.MetaSchema)) })
	rep, err := cdc.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRep := context.WithCancel(ctx)
	repDone := make(chan error, 1)
	go func() { repDone <- rep.Run(rctx) }()
	defer func() { stopRep(); <-repDone }()
	kill, err := sql.Open("mysql", down.Root)
	if err != nil {
		t.Fatal(err)
	}
	defer kill.Close()

	// Caught up: the applied checkpoint within a second of real time.
	deadline := time.Now().Add(2 * time.Minute)
	for st := rep.Status(); st.AppliedTs == 0 || time.Since(tso.Time(st.AppliedTs)) > time.Second; st = rep.Status() {
		if time.Now().After(deadline) {
			t.Fatalf("the applier did not catch up in 2 minutes: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // live replication

	diff := func(scope string) (*checker.Report, uint64, error) {
		t.Helper()
		pair := openPair(t, ctx, rep, upDSN, down.DB, kill)
		defer pair.Close()
		dcfg := checker.DefaultConfig()
		dcfg.Tables = []string{db + ".*"}
		dcfg.MetaSchema = cfg.Applier.MetaSchema
		dcfg.Changefeed = checker.ChangefeedConfig{ID: cfg.Changefeed.ID, MetaSchema: cfg.Applier.MetaSchema}
		dcfg.Scope, dcfg.CaughtUpLag = scope, caughtUpLag
		dcfg.OutputDir = t.TempDir()
		dcfg.Logger = slog.New(slog.DiscardHandler)
		src := pair.Sources
		src.Meta = down.DB
		r, err := checker.NewDiff(dcfg, &src).Run(ctx)
		return r, pair.TS, err
	}

	// No table verified clean yet: scope cdc is refused, naming the tables.
	if _, _, err := diff("cdc"); !errors.Is(err, checker.ErrScopeUnavailable) || !strings.Contains(err.Error(), db+".sbtest1: no clean verification") {
		t.Fatalf("cdc diff before any clean verification: %v", err)
	}
	// A full diff under load: equal, and every table verified at its pair.
	r, t1, err := diff("full")
	if err != nil {
		t.Fatal(err)
	}
	if !r.Equal || len(r.Tables) != 3 || r.RecheckRounds != 0 {
		t.Fatalf("full diff under load at %d: equal %v, %d tables", t1, r.Equal, len(r.Tables))
	}
	vs, err := checker.Verifications(ctx, down.DB, cfg.Applier.MetaSchema, cfg.Changefeed.ID)
	if err != nil || len(vs) != 3 {
		t.Fatalf("verifications after a clean full diff: %+v, %v", vs, err)
	}
	for _, v := range vs {
		if v.Ts != t1 || v.Schema != db {
			t.Fatalf("verification %+v, want at %d", v, t1)
		}
	}
	time.Sleep(4 * time.Second) // changes after T1
	res, err := load.Stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("loadgen: %v", err)
	}
	waitApplied(t, rep, res.ResolvedTs)
	t2 := rep.Status().AppliedTs

	// What the ledger says, read independently of the checker.
	rd := ledger.Reader{Q: down.DB, MetaSchema: cfg.Applier.MetaSchema, Changefeed: cfg.Changefeed.ID, Timeout: time.Minute}
	bounds, err := rd.Bounds(ctx)
	if err != nil || bounds.Since != importTs || bounds.Applied != t2 {
		t.Fatalf("ledger bounds %+v, %v; want since the import %d, applied %d", bounds, err, importTs, t2)
	}
	up, err := rd.CaughtUp(ctx, caughtUpLag)
	if err != nil || !up.Found || up.Ts <= importTs || up.Ts >= t1 {
		t.Fatalf("caught up %+v, %v: want a point between the import %d and T1 %d", up, err, importTs, t1)
	}
	lastChange := map[string]map[int64]uint64{}
	for _, tb := range []string{"sbtest1", "sbtest2"} {
		es, err := ledger.Read(ctx, rd, db, tb, importTs, t2)
		if err != nil {
			t.Fatal(err)
		}
		lastChange[tb] = map[int64]uint64{}
		for _, e := range es {
			vals, err := e.Key.Values()
			if err != nil || len(vals) != 1 {
				t.Fatalf("%s: ledger key %v: %v", tb, e.Key, err)
			}
			id, ok := vals[0].(int64)
			if !ok {
				t.Fatalf("%s: ledger key %v is not an INT id", tb, e.Key)
			}
			lastChange[tb][id] = e.CommitTs
		}
	}
	exists := func(tb string) map[int64]bool {
		out := map[int64]bool{}
		for _, s := range queryColumn(t, down.DB, "SELECT id FROM "+ident.Table(db, tb)) {
			id, _ := strconv.ParseInt(s, 10, 64)
			out[id] = true
		}
		return out
	}

	// The divergences, on sbtest1: per class an update, a delete and an insert.
	type injected struct {
		table, kind, class string
		id                 int64
		cts                uint64 // last change through the changefeed (0: none)
	}
	var inj []injected
	present := exists("sbtest1")
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(class string, want func(id int64, cts uint64, changed bool) bool, alive bool) (int64, uint64) {
		var ids []int64
		for id := int64(1); id < 100000; id++ {
			cts, changed := lastChange["sbtest1"][id]
			if present[id] == alive && want(id, cts, changed) && !slices.ContainsFunc(inj, func(i injected) bool { return i.id == id }) {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			t.Fatalf("no %s row (alive %v) to diverge", class, alive)
		}
		id := ids[rng.IntN(len(ids))]
		return id, lastChange["sbtest1"][id]
	}
	classes := []struct {
		class string
		want  func(id int64, cts uint64, changed bool) bool
	}{
		{checker.ClassImported, func(id int64, _ uint64, changed bool) bool { return !changed && id <= 2000 }},
		{checker.ClassPostImport, func(_ int64, cts uint64, changed bool) bool { return changed && cts < up.Ts }},
		{checker.ClassCDC, func(_ int64, cts uint64, changed bool) bool { return changed && cts > t1 }},
	}
	for _, c := range classes {
		id, cts := pick(c.class, c.want, true)
		inj = append(inj, injected{"sbtest1", "differing", c.class, id, cts})
		id, cts = pick(c.class, c.want, true)
		inj = append(inj, injected{"sbtest1", "missing", c.class, id, cts})
	}
	// Inserts: an id never used (imported: the changefeed never had it), and ids whose last
	// change was a delete while catching up and after T1.
	inj = append(inj, injected{"sbtest1", "extra", checker.ClassImported, 50_000_000, 0})
	for _, c := range classes[1:] {
		id, cts := pick(c.class, c.want, false)
		inj = append(inj, injected{"sbtest1", "extra", c.class, id, cts})
	}
	for _, in := range inj {
		tbl := ident.Table(db, in.table)
		var q string
		switch in.kind {
		case "differing":
			q = fmt.Sprintf("UPDATE %s SET c = 'diverged' WHERE id = %d", tbl, in.id)
		case "missing":
			q = fmt.Sprintf("DELETE FROM %s WHERE id = %d", tbl, in.id)
		case "extra":
			q = fmt.Sprintf("INSERT INTO %s (id, k, c, pad) VALUES (%d, 1, 'extra', 'extra')", tbl, in.id)
		}
		if _, err := down.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		t.Logf("diverged %s %s id %d (%s, last change %d)", in.table, in.kind, in.id, in.class, in.cts)
	}
	if _, err := down.ExecContext(ctx, "INSERT INTO "+ident.Table(db, loadgen.KeylessTable)+" VALUES (424242, 'diverged')"); err != nil {
		t.Fatal(err)
	}

	found := func(r *checker.Report) []string {
		var out []string
		for _, tr := range r.Tables {
			for _, d := range tr.Differences {
				out = append(out, fmt.Sprintf("%s %s %s %s", tr.Table, d.Kind, d.Key[0].Value, d.Class))
			}
		}
		slices.Sort(out)
		return out
	}
	expect := func(keep func(injected) bool) []string {
		out := []string{loadgen.KeylessTable + " extra 424242 " + checker.ClassUnclassified}
		for _, in := range inj {
			if keep(in) {
				out = append(out, fmt.Sprintf("%s %s %d %s", in.table, in.kind, in.id, in.class))
			}
		}
		slices.Sort(out)
		return out
	}
	table := func(r *checker.Report, name string) checker.TableReport {
		for _, tr := range r.Tables {
			if tr.Table == name {
				return tr
			}
		}
		t.Fatalf("no %s in the report", name)
		return checker.TableReport{}
	}

	// A full diff at a pair: every divergence, with its class, and nothing else.
	r, ts, err := diff("full")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := found(r), expect(func(injected) bool { return true }); !slices.Equal(got, want) {
		t.Errorf("full diff at %d:\n got  %q\n want %q", ts, got, want)
	}
	if c := r.Classification; c == nil || c.CaughtUpTs != up.Ts || c.LedgerSinceTs != importTs {
		t.Errorf("classification %+v: want caught up at %d, ledger since %d", c, up.Ts, importTs)
	}
	rows1 := table(r, "sbtest1").RowsChecked
	t.Logf("full diff at %d: %v; sbtest1 %d rows", ts, r.DifferencesByClass, rows1)

	// since:<import>: the post-import and cdc divergences, reading only the ledger's keys.
	r, ts, err = diff(fmt.Sprintf("since:%d", importTs))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := found(r), expect(func(in injected) bool { return in.class != checker.ClassImported }); !slices.Equal(got, want) {
		t.Errorf("since:%d diff:\n got  %q\n want %q", importTs, got, want)
	}
	checkScoped := func(r *checker.Report, froms map[string]uint64) {
		t.Helper()
		for _, name := range []string{"sbtest1", "sbtest2"} {
			from := froms[name]
			tr := table(r, name)
			keys := 0
			for _, cts := range lastChange[name] {
				if cts > from {
					keys++
				}
			}
			if tr.Scope != "keys" || tr.ScopeKeys != int64(keys) || tr.ScopeFromTs != from || tr.RowsChecked > tr.ScopeKeys || tr.DownstreamRows > tr.ScopeKeys {
				t.Errorf("%s: scope %q, %d keys in (%d, %d], %d/%d rows compared; want the %d ledger keys after %d", name, tr.Scope,
					tr.ScopeKeys, tr.ScopeFromTs, tr.ScopeUntilTs, tr.RowsChecked, tr.DownstreamRows, keys, from)
			}
			t.Logf("%s: %d keys in scope, %d/%d rows compared (the full diff compared %d)", name, tr.ScopeKeys, tr.RowsChecked, tr.DownstreamRows, rows1)
		}
		if kl := table(r, loadgen.KeylessTable); kl.Scope != "whole" || !strings.Contains(kl.ScopeNote, "keyless") {
			t.Errorf("keyless table in a scoped diff: scope %q, note %q", kl.Scope, kl.ScopeNote)
		}
	}
	checkScoped(r, map[string]uint64{"sbtest1": importTs, "sbtest2": importTs})
	if tr := table(r, "sbtest1"); tr.RowsChecked >= rows1 {
		t.Errorf("since: diff compared %d rows of sbtest1, the full diff %d: not scoped", tr.RowsChecked, rows1)
	}

	// cdc: since each table's last clean verification: T1 for sbtest1; sbtest2, equal in
	// the diffs since, was verified again at their pairs.
	froms := map[string]uint64{}
	vs, err = checker.Verifications(ctx, down.DB, cfg.Applier.MetaSchema, cfg.Changefeed.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		froms[v.Table] = v.Ts
	}
	if froms["sbtest1"] != t1 || froms["sbtest2"] <= t1 {
		t.Fatalf("verifications before the cdc diff: %+v; want sbtest1 at T1 %d, sbtest2 later", vs, t1)
	}
	r, ts, err = diff("cdc")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := found(r), expect(func(in injected) bool { return in.cts > t1 }); !slices.Equal(got, want) {
		t.Errorf("cdc diff at %d:\n got  %q\n want %q", ts, got, want)
	}
	checkScoped(r, froms)
}

func queryColumn(t *testing.T, db *sql.DB, q string) []string {
	t.Helper()
	rows, err := db.Query(q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

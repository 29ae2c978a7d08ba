package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestInjectedDivergencesUnderLiveLoad (#17, the second "done when"): divergences written
// straight into the fallback while `parity loadgen` keeps writing to TiDB are found by the
// daemon's next full run and its cdc-scoped run, each with its kind and class and
// nothing else; `parity repair` fixes them while the load goes on, and the next full run
// is clean.
//
// Loadgen picks the rows it updates or deletes uniformly among every id it ever used, so
// no row of a database it is writing is safe from it: a divergence on such a row may be
// overwritten by replication before the run and "found" by luck. So the load runs in two
// databases, one after the other, on one topic and one changefeed:
//
//   - A: imported into the fallback, then transactions (inserts, updates, deletes, key
//     moves) while `parity serve` starts seconds later, catches up on the backlog and
//     replicates live; a full run (T1) finds A equal under load; A's load goes on past T1,
//     then stops. Its rows now carry every class: imported (never changed since the
//     import), post-import (last changed before the applier came within caught-up-lag)
//     and cdc (last changed during live replication, before and after T1), and no load
//     will touch them again.
//   - B: a new database created upstream (its CREATE DATABASE and CREATE TABLEs come
//     through the changefeed), under a load of its own from then to the end of the test.
//
// While B's load runs, an UPDATE, a DELETE and an INSERT per class are written into A's
// sbtest1 in the fallback (the inserts on ids absent upstream: one never used, the others
// last deleted while catching up and after T1), and one more UPDATE on a cdc row changed
// before T1 (cdc class, outside the cdc scope). The expected classes come from the ledger
// and ts-map as the applier wrote them, read independently of the checker. Then, through
// the daemon (`parity verify`, `parity repair`) with B's load going on:
//   - a full run reports exactly the ten differences, each with its kind and class (as
//     stored in the meta schema and counted in the run's record), and none in B;
//   - a cdc run (each table's keys changed since its last clean verification: T1 for A's
//     sbtest1, the full run's pair for the others) reports exactly the three changed
//     after T1 and reads fewer rows;
//   - `parity repair --run` upserts or deletes each key while rows are being applied,
//     its re-verification is clean, and so is the next full run.
//
// It logs the rows/s of both loads and of the applier from the injection to the last run
// (B aims at ≥ 1,000 rows/s; the machine is shared, so the rate is logged, not asserted).
func TestInjectedDivergencesUnderLiveLoad(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "inject", 3)
	base := testenv.UniqueName("inject")
	dbA, dbB := base+"_a", base+"_b"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	began := time.Now()
	const (
		caughtUpLag = 3 * time.Second
		importRows  = 5000
	)

	// A: imported, then a load the applier starts behind.
	aStart := time.Now()
	loadA := startLoad(t, ctx, upDSN, down.Root, broker, topic, dbA, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 2, 8, importRows
		lg.AllTypes, lg.Keyless = false, false
		lg.Rate, lg.RowsPerTxn = 0, 10
	})
	importTs := loadA.ImportTs
	time.Sleep(6 * time.Second) // a backlog the applier catches up on

	cfg := verifyServeConfig(t, "inject-live", upDSN, down, broker, topic, dbA, importTs)
	// The injections stand for damage the ledger classifies (imported, post-import, cdc);
	// with bypass detection on, each would be classed bypass, over every other class
	// (TestBypassWritesUnderLiveLoad and TestCutoverGateBypass cover that).
	cfg.Bypass.Enabled = false
	cfg.Verify.Tables = []string{dbA + ".*", dbB + ".*"}
	cfg.Verify.CaughtUpLag = caughtUpLag
	cfg.Verify.TSMapInterval = time.Second
	addr := cfg.Status.Addr
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := runServeInTest(t, ctx, cfg)
	defer srv.Close()
	status := srv.Status
	waitApplied := func(ts uint64) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); status().AppliedTs < ts; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the applier did not pass ts %d within a minute", ts)
			}
		}
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if st, _, err := fetchStatus(ctx, addr); err == nil && st.AppliedTs > importTs && st.AppliedLagSeconds < 1 {
			break
		}
		if ended, err := loadA.Ended(); ended {
			t.Fatalf("loadgen A ended: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not catch up within 2 minutes: %+v", status())
		}
	}
	caughtUpAfter := time.Since(aStart)
	time.Sleep(3 * time.Second) // live replication before T1

	// A clean full run under load: every table of A verified at T1.
	first := verifyCLIExit(t, addr, 0)
	if first.Result != verify.ResultEqual || first.TablesCompared != 2 || first.Resolved != 0 {
		t.Fatalf("full run under load: %+v", first)
	}
	meta := down.DB
	verifiedAt := func() map[string]uint64 { return verifiedTables(t, ctx, meta, cfg) }
	t1 := verifiedAt()[dbA+".sbtest1"]
	if t1 < first.FirstTS || t1 > first.LastTS {
		t.Fatalf("%s.sbtest1 verified at %d, not at a pair of run %s (%d..%d)", dbA, t1, first.RunID, first.FirstTS, first.LastTS)
	}
	time.Sleep(3 * time.Second) // cdc changes after T1
	resA, err := loadA.Stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("loadgen A: %v", err)
	}
	aSecs := time.Since(aStart).Seconds()

	// B: from now to the end, a load the daemon replicates live.
	bStart := time.Now()
	const bTables = 4 // sbtest1..4
	loadB := startLoad(t, ctx, upDSN, down.Root, broker, topic, dbB, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = bTables, 8, 0
		lg.AllTypes, lg.Keyless = false, false
		lg.Rate, lg.RowsPerTxn = 0, 10
		lg.CheckImages = true // a wrong image (TiDB read inside the transaction) stops the load, named
	})
	waitApplied(resA.ResolvedTs)
	// B's tables, created through the changefeed.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		var n int
		if err := down.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ?", dbB).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == bTables {
			break
		}
		if ended, err := loadB.Ended(); ended {
			t.Fatalf("loadgen B ended: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of B's %d tables in the fallback after a minute", n, bTables)
		}
	}

	// What the ledger says about A's rows, read independently of the checker.
	rd := ledger.Reader{Q: down.DB, MetaSchema: cfg.Applier.MetaSchema, Changefeed: cfg.Changefeed.ID, Timeout: time.Minute}
	up, err := rd.CaughtUp(ctx, caughtUpLag)
	if err != nil || !up.Found || up.Ts <= importTs || up.Ts >= t1 {
		t.Fatalf("caught up %+v, %v: want a point between the import %d and T1 %d", up, err, importTs, t1)
	}
	es, err := ledger.Read(ctx, rd, dbA, "sbtest1", importTs, resA.ResolvedTs)
	if err != nil {
		t.Fatal(err)
	}
	lastChange := map[int64]uint64{}
	for _, e := range es {
		vals, err := e.Key.Values()
		id, ok := int64(0), false
		if err == nil && len(vals) == 1 {
			id, ok = vals[0].(int64)
		}
		if !ok {
			t.Fatalf("ledger key %v of %s.sbtest1: not an INT id (%v)", e.Key, dbA, err)
		}
		lastChange[id] = e.CommitTs
	}
	present := map[int64]bool{}
	for _, s := range queryColumn(t, down.DB, "SELECT id FROM "+ident.Table(dbA, "sbtest1")) {
		id, _ := strconv.ParseInt(s, 10, 64)
		present[id] = true
	}

	// The divergences, on A's sbtest1.
	type injected struct {
		kind  checker.DiffKind
		class string
		id    int64
		cts   uint64 // last change through the changefeed (0: none)
	}
	var inj []injected
	rng := rand.New(rand.NewPCG(17, 2))
	ids := make([]int64, 0, len(lastChange)+importRows)
	for id := range lastChange {
		ids = append(ids, id)
	}
	for id := int64(1); id <= importRows; id++ {
		if _, ok := lastChange[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	pick := func(what string, kind checker.DiffKind, class string, want func(cts uint64, changed bool) bool) {
		t.Helper()
		alive := kind != checker.Extra
		var cands []int64
		for _, id := range ids {
			cts, changed := lastChange[id]
			if present[id] == alive && want(cts, changed) && !slices.ContainsFunc(inj, func(i injected) bool { return i.id == id }) {
				cands = append(cands, id)
			}
		}
		if len(cands) == 0 {
			t.Fatalf("no %s row (present %v) to diverge", what, alive)
		}
		id := cands[rng.IntN(len(cands))]
		inj = append(inj, injected{kind, class, id, lastChange[id]})
	}
	imported := func(_ uint64, changed bool) bool { return !changed }
	postImport := func(cts uint64, changed bool) bool { return changed && cts < up.Ts }
	cdcAfterT1 := func(cts uint64, changed bool) bool { return changed && cts > t1 }
	for _, kind := range []checker.DiffKind{checker.Differing, checker.Missing} {
		pick("imported", kind, checker.ClassImported, imported)
	}
	for _, kind := range []checker.DiffKind{checker.Differing, checker.Missing, checker.Extra} {
		pick("post-import", kind, checker.ClassPostImport, postImport)
		pick("cdc after T1", kind, checker.ClassCDC, cdcAfterT1)
	}
	pick("cdc before T1", checker.Differing, checker.ClassCDC, func(cts uint64, changed bool) bool { return changed && cts > up.Ts && cts < t1 })
	// Loadgen's ids stay far below this one: the changefeed never had it.
	inj = append(inj, injected{checker.Extra, checker.ClassImported, 50_000_000, 0})

	if ended, err := loadB.Ended(); ended {
		t.Fatalf("loadgen B ended: %v", err)
	}
	window0, windowStart := status(), time.Now()
	tbl := ident.Table(dbA, "sbtest1")
	for _, in := range inj {
		var q string
		switch in.kind {
		case checker.Differing:
			q = fmt.Sprintf("UPDATE %s SET c = 'diverged' WHERE id = %d", tbl, in.id)
		case checker.Missing:
			q = fmt.Sprintf("DELETE FROM %s WHERE id = %d", tbl, in.id)
		case checker.Extra:
			q = fmt.Sprintf("INSERT INTO %s (id, k, c, pad) VALUES (%d, 1, 'extra', 'extra')", tbl, in.id)
		}
		res, err := down.ExecContext(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			t.Fatalf("%s: %d rows, %v", q, n, err)
		}
		t.Logf("diverged sbtest1 %s id %d (%s, last change %d)", in.kind, in.id, in.class, in.cts)
	}
	expect := func(keep func(injected) bool) []string {
		var out []string
		for _, in := range inj {
			if keep(in) {
				out = append(out, fmt.Sprintf("%s.sbtest1 id=%d %s %s", dbA, in.id, in.kind, in.class))
			}
		}
		slices.Sort(out)
		return out
	}
	// reported returns a run's stored differences as "schema.table key kind class".
	reported := func(r verify.RunRecord) []string {
		t.Helper()
		var out []string
		for _, tr := range r.Tables {
			if tr.DiffRunID == "" {
				continue
			}
			diffs, err := checker.RunDifferences(ctx, meta, cfg.Applier.MetaSchema, tr.DiffRunID, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range diffs {
				out = append(out, fmt.Sprintf("%s.%s %s %s %s", d.UpSchema, d.UpTable, d.Key, d.Kind, d.Class))
			}
		}
		slices.Sort(out)
		return out
	}
	byClass := func(keep func(injected) bool) map[string]int64 {
		out := map[string]int64{}
		for _, in := range inj {
			if keep(in) {
				out[in.class]++
			}
		}
		return out
	}
	tablesOf := func(r verify.RunRecord) (a, b int) {
		for _, tr := range r.Tables {
			switch tr.Schema {
			case dbA:
				a++
			case dbB:
				b++
			}
		}
		return a, b
	}

	// explainB explains (explainRun) a run's differences in B, where the sides hold the
	// same data: a false mismatch if the pair is consistent (seen once on a loaded machine).
	upDB, err := sql.Open("mysql", upDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer upDB.Close()
	explainB := func(r verify.RunRecord, froms map[string]uint64) {
		t.Helper()
		inB := r
		inB.Tables = slices.DeleteFunc(slices.Clone(r.Tables), func(tr verify.TableRecord) bool { return tr.Schema != dbB })
		explainRun(t, ctx, upDB, meta, cfg, srv, inB, froms)
	}

	// The next full run: every divergence with its kind and class, nothing else, in A
	// and in B (B's tables under load).
	all := func(injected) bool { return true }
	full := verifyCLIExit(t, addr, 1)
	if got, want := reported(full), expect(all); !slices.Equal(got, want) {
		t.Errorf("full run %s:\n got  %q\n want %q", full.RunID, got, want)
		explainB(full, verifiedAt())
	}
	if a, b := tablesOf(full); full.Result != verify.ResultDifferent || a != 2 || b != bTables || full.Differences != int64(len(inj)) || full.Resolved != 0 {
		t.Errorf("full run %s: %s, %d+%d tables, %d differences (%d resolved), want %d", full.RunID, full.Result, a, b, full.Differences, full.Resolved, len(inj))
	}
	if want := byClass(all); !maps.Equal(full.DifferencesByClass, want) {
		t.Errorf("full run %s by class %v, want %v", full.RunID, full.DifferencesByClass, want)
	}
	t.Logf("full run %s at %d: %d differences %v over %d tables", full.RunID, full.FirstTS, full.Differences, full.DifferencesByClass, full.TablesCompared)

	// The cdc run: the keys changed since each table's last clean verification. A's
	// sbtest1 was last clean at T1; every other table was clean in the full run.
	froms := verifiedAt()
	if froms[dbA+".sbtest1"] != t1 || len(froms) != 2+bTables {
		t.Fatalf("verifications before the cdc run: %v; want %s.sbtest1 still at T1 %d and %d tables", froms, dbA, t1, 2+bTables)
	}
	inScope := func(in injected) bool { return in.cts > t1 }
	scoped := verifyCLIExit(t, addr, 1, "--scope", "cdc")
	if got, want := reported(scoped), expect(inScope); !slices.Equal(got, want) {
		t.Errorf("cdc run %s:\n got  %q\n want %q", scoped.RunID, got, want)
		explainB(scoped, froms)
	}
	if a, b := tablesOf(scoped); scoped.Scope != "cdc" || a != 2 || b != bTables || scoped.Resolved != 0 {
		t.Errorf("cdc run %s: scope %q, %d+%d tables, %d resolved", scoped.RunID, scoped.Scope, a, b, scoped.Resolved)
	}
	if want := byClass(inScope); !maps.Equal(scoped.DifferencesByClass, want) {
		t.Errorf("cdc run %s by class %v, want %v", scoped.RunID, scoped.DifferencesByClass, want)
	}
	if scoped.RowsChecked >= full.RowsChecked {
		t.Errorf("cdc run %s compared %d rows, the full run %d: not scoped", scoped.RunID, scoped.RowsChecked, full.RowsChecked)
	}
	t.Logf("cdc run %s: %d differences %v, %d rows compared (the full run %d)", scoped.RunID, scoped.Differences, scoped.DifferencesByClass, scoped.RowsChecked, full.RowsChecked)
	if t.Failed() {
		// Diagnosis: with B's load stopped and applied, does B still differ (a real
		// divergence: a lost delete never heals, loadgen never reuses an id) or not?
		resB, err := loadB.Stop()
		t.Logf("diagnosis: load B stopped at resolved ts %d (%v)", resB.ResolvedTs, err)
		waitApplied(resB.ResolvedTs)
		quiet := verifyCLIExit(t, addr, 1)
		var inB []string
		for _, d := range reported(quiet) {
			if !strings.Contains(d, dbA+".") {
				inB = append(inB, d)
			}
		}
		t.Logf("diagnosis: full run %s with B quiet, at %d: %d differences, %d outside A: %q", quiet.RunID, quiet.FirstTS, quiet.Differences, len(inB), inB)
		t.FailNow()
	}

	// Repaired while B's load goes on: clean at once, and the next full run too.
	st0 := status()
	rep := repairCLI(t, addr, 0, "--run", full.RunID)
	st1 := status()
	got := outcomes(rep)
	for _, in := range inj {
		want := cdc.RepairUpsert
		if in.kind == checker.Extra {
			want = cdc.RepairDelete
		}
		if k := fmt.Sprintf("sbtest1 id=%d", in.id); got[k] != want {
			t.Errorf("repair %s: %s %q, want %q", rep.ID, k, got[k], want)
		}
	}
	if len(rep.Outcomes) != len(inj) || rep.Reverify == nil || rep.Reverify.Result != verify.ResultEqual || rep.Reverify.Resolved != 0 {
		t.Fatalf("repair %s: %d keys, re-verification %+v", rep.ID, len(rep.Outcomes), rep.Reverify)
	}
	if st1.RowsApplied <= st0.RowsApplied {
		t.Fatalf("nothing was applied during the repair (%d rows before, %d after): the load did not go on", st0.RowsApplied, st1.RowsApplied)
	}
	if ended, err := loadB.Ended(); ended {
		t.Fatalf("loadgen B ended during the repair: %v", err)
	}
	t.Logf("repair %s: %d keys (%d upserted, %d deleted) in %d barrier(s), longest %v, %d rows applied meanwhile",
		rep.ID, len(rep.Outcomes), rep.Upserted, rep.Deleted, rep.Barriers, rep.MaxPause, st1.RowsApplied-st0.RowsApplied)
	clean := verifyCLIExit(t, addr, 0)
	if a, b := tablesOf(clean); clean.Result != verify.ResultEqual || a != 2 || b != bTables || clean.Differences != 0 || clean.Resolved != 0 {
		t.Fatalf("full run %s after the repair: %+v", clean.RunID, clean)
	}

	window1 := status()
	windowSecs := time.Since(windowStart).Seconds()
	windowRate := float64(window1.RowsApplied-window0.RowsApplied) / windowSecs
	resB, err := loadB.Stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("loadgen B: %v", err)
	}
	bSecs := time.Since(bStart).Seconds()
	rateB := float64(resB.Rows) / bSecs
	t.Logf("load A: %d rows in %.1fs (%.0f rows/s), the applier caught up %v after A started; load B: %d rows in %.1fs (%.0f rows/s), "+
		"%.0f rows/s applied from the injection to the clean run after the repair (%.1fs); test %v",
		resA.Rows, aSecs, float64(resA.Rows)/aSecs, caughtUpAfter.Round(100*time.Millisecond), resB.Rows, bSecs, rateB,
		windowRate, windowSecs, time.Since(began).Round(time.Second))
	if windowRate < 1000 {
		t.Logf("the live load ran below 1,000 rows/s: the machine is shared and was busy")
	}
}

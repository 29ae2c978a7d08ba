package main

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestBypassWritesUnderLiveLoad (#20 item 4): `parity serve` with bypass detection on,
// replicating a live loadgen workload (keyed and keyless tables) into the real fallback:
//   - a hand-written INSERT, UPDATE and DELETE on the fallback are each detected within
//     5 s, in /status with table, key, GTID, position and time, and in bypass_writes;
//   - parity is stopped and started again under the load: a write made while it was down
//     is detected after the restart, from the saved position, and nothing twice;
//   - once the load stopped, a full run classifies the differences of those keys as
//     bypass, `parity repair` fixes them, and the next run is clean;
//   - over the whole test, bypass_writes holds exactly the hand-written changes: none of
//     the applier's (keyed, keyless) or the repair's writes is ever flagged;
//   - /metrics counts them (parity_bypass_writes_total by table) and lints clean.
//
// A restart of the fallback itself is exercised by cdc/bypass's
// TestDetectsAcrossFallbackRestart on a private MariaDB (the shared fallback serves every
// test at once and must not be restarted).
func TestBypassWritesUnderLiveLoad(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "bypass", 3)
	db := testenv.UniqueName("bypass")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 2, 4, 2000
		lg.AllTypes, lg.Keyless = false, true
		lg.Rate, lg.RowsPerTxn = 0, 10
	})
	cfg := verifyServeConfig(t, "bypass-live", upDSN, down, broker, topic, db, load.ImportTs)
	var sid [4]byte
	_, _ = rand.Read(sid[:])
	cfg.Bypass.Enabled, cfg.Bypass.ServerID = true, 100000+binary.LittleEndian.Uint32(sid[:])%1000000000
	cfg.Bypass.Schemas = []string{db}
	cfg.API.Addr = "" // not needed here; its default port is shared
	addr := cfg.Status.Addr
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	serve := func() (stop func()) {
		srv := runServeInTest(t, ctx, cfg)
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
			st, _, err := fetchStatus(ctx, addr)
			if err == nil && st.AppliedTs > load.ImportTs && st.AppliedLagSeconds < 2 && st.Bypass != nil && st.Bypass.State == "reading" {
				return srv.Close
			}
			if ended, err := srv.Ended(); ended {
				t.Fatalf("serve ended: %v", err)
			}
			if ended, err := load.Ended(); ended {
				t.Fatalf("loadgen ended: %v", err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("serve not caught up and reading the binlog within 2 minutes: %+v, %v", st, err)
			}
		}
	}
	stop := serve()
	time.Sleep(3 * time.Second) // parity's own writes under load, in the binlog

	tbl := ident.Table(db, "sbtest1")
	exec := func(q string) {
		t.Helper()
		res, err := down.ExecContext(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			t.Fatalf("%s: %d rows, %v", q, n, err)
		}
	}
	// Rows loadgen never uses (its ids stay far below): their differences stay put.
	const base = 50_000_000
	var want []string // "kind key" of every hand-written change, in order
	detected := func(kind, key string) {
		t.Helper()
		want = append(want, kind+" "+key)
		begin := time.Now()
		for {
			st, _, err := fetchStatus(ctx, addr)
			if err == nil && st.Bypass != nil && slices.ContainsFunc(st.Bypass.Recent, func(d bypass.Detection) bool {
				return d.Table == db+".sbtest1" && d.Kind == kind && d.Key == key
			}) {
				i := slices.IndexFunc(st.Bypass.Recent, func(d bypass.Detection) bool { return d.Kind == kind && d.Key == key })
				d := st.Bypass.Recent[i]
				if d.GTID == "" || d.Position == "" || d.Time.IsZero() {
					t.Fatalf("detection %+v: want GTID, position and time", d)
				}
				t.Logf("%s %s detected in %v (GTID %s at %s)", kind, key, time.Since(begin).Round(time.Millisecond), d.GTID, d.Position)
				return
			}
			if time.Since(begin) > 5*time.Second {
				t.Fatalf("%s %s on %s not in /status within 5 s: %+v (%v)", kind, key, tbl, st.Bypass, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	exec(fmt.Sprintf("INSERT INTO %s (id, k, c, pad) VALUES (%d, 1, 'bypass', 'bypass')", tbl, base))
	detected(bypasslog.KindInsert, fmt.Sprintf("id=%d", base))
	exec(fmt.Sprintf("INSERT INTO %s (id, k, c, pad) VALUES (%d, 1, 'bypass', 'bypass')", tbl, base+1))
	detected(bypasslog.KindInsert, fmt.Sprintf("id=%d", base+1))
	exec(fmt.Sprintf("UPDATE %s SET c = 'bypass, updated' WHERE id = %d", tbl, base+1))
	detected(bypasslog.KindUpdate, fmt.Sprintf("id=%d", base+1))
	exec(fmt.Sprintf("DELETE FROM %s WHERE id = %d", tbl, base))
	detected(bypasslog.KindDelete, fmt.Sprintf("id=%d", base))

	// parity restarts under the load; a write while it is down is found after.
	stop()
	exec(fmt.Sprintf("INSERT INTO %s (id, k, c, pad) VALUES (%d, 1, 'while down', 'x')", tbl, base+2))
	time.Sleep(2 * time.Second) // more of parity's changes wait in Kafka meanwhile
	stop = serve()
	detected(bypasslog.KindInsert, fmt.Sprintf("id=%d", base+2))
	time.Sleep(3 * time.Second) // the backlog applied, live again

	// The load stops; the run after it sees the bypass writes' keys as bypass.
	res, err := load.Stop()
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("loadgen: %v", err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		st, _, err := fetchStatus(ctx, addr)
		if err == nil && st.AppliedTs >= res.ResolvedTs {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the applier did not reach the load's final resolved ts %d within a minute", res.ResolvedTs)
		}
	}
	meta := down.DB
	full := verifyCLIExit(t, addr, 1)
	var got []string
	for _, tr := range full.Tables {
		if tr.DiffRunID == "" {
			continue
		}
		diffs, err := checker.RunDifferences(ctx, meta, cfg.Applier.MetaSchema, tr.DiffRunID, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range diffs {
			got = append(got, fmt.Sprintf("%s.%s %s %s %s", d.UpSchema, d.UpTable, d.Key, d.Kind, d.Class))
		}
	}
	slices.Sort(got)
	wantDiffs := []string{
		fmt.Sprintf("%s.sbtest1 id=%d extra bypass", db, base+1),
		fmt.Sprintf("%s.sbtest1 id=%d extra bypass", db, base+2),
	}
	if !slices.Equal(got, wantDiffs) || !maps.Equal(full.DifferencesByClass, map[string]int64{checker.ClassBypass: 2}) {
		t.Fatalf("full run %s: differences\n%q\nby class %v; want\n%q, all bypass", full.RunID, got, full.DifferencesByClass, wantDiffs)
	}

	// The repair's writes (and the applier's meanwhile) are parity's: never flagged.
	rep := repairCLI(t, addr, 0, "--run", full.RunID)
	if o := outcomes(rep); len(o) != 2 || o[fmt.Sprintf("sbtest1 id=%d", base+1)] != cdc.RepairDelete || o[fmt.Sprintf("sbtest1 id=%d", base+2)] != cdc.RepairDelete {
		t.Fatalf("repair %s: %v", rep.ID, o)
	}
	if rep.Reverify == nil || rep.Reverify.Result != verify.ResultEqual {
		t.Fatalf("repair %s: re-verification %+v", rep.ID, rep.Reverify)
	}
	time.Sleep(2 * time.Second) // the repair's transactions read by the detector

	// Exactly the hand-written changes, each once, over the whole test.
	var all []string
	for _, table := range queryColumn(t, meta, "SELECT DISTINCT table_name FROM "+ident.Table(cfg.Applier.MetaSchema, bypasslog.WritesTable)) {
		ws, err := bypasslog.Read(ctx, meta, cfg.Applier.MetaSchema, cfg.Changefeed.ID, db, table, time.Time{}, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range ws {
			if w.GTID == "" || w.File == "" || w.Pos == 0 {
				t.Errorf("detection %+v without GTID or position", w)
			}
			all = append(all, w.Kind+" "+w.Text)
			if table != "sbtest1" {
				t.Errorf("parity's own write flagged: %s.%s %s %s", db, table, w.Kind, w.Text)
			}
		}
	}
	if !slices.Equal(all, want) {
		t.Fatalf("bypass_writes holds\n%q\nwant exactly the hand-written changes\n%q", all, want)
	}
	metrics := httpGet(t, "http://"+addr+"/metrics")
	lintMetrics(t, metrics)
	// The restarted daemon counts what it detected since it started (one), and the
	// newest detection's time across restarts.
	if line := fmt.Sprintf(`parity_bypass_writes_total{changefeed=%q,table="%s.sbtest1"} 1`, cfg.Changefeed.ID, db); !strings.Contains(metrics, line) {
		t.Errorf("/metrics has no %s", line)
	}
	if strings.Contains(metrics, fmt.Sprintf(`parity_bypass_last_write_timestamp_seconds{changefeed=%q} 0`, cfg.Changefeed.ID)) ||
		!strings.Contains(metrics, fmt.Sprintf(`parity_bypass_up{changefeed=%q} 1`, cfg.Changefeed.ID)) {
		t.Errorf("/metrics: bypass gauges wrong:\n%s", grepLines(metrics, "parity_bypass_"))
	}
	clean := verifyCLIExit(t, addr, 0)
	if clean.Result != verify.ResultEqual {
		t.Fatalf("full run %s after the repair: %+v", clean.RunID, clean)
	}
	stop()
}

func grepLines(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

package main

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestSnapshotPairsUnderLoad (#17 item 1): while loadgen runs transactions on the real
// TiDB and the applier replicates them through real Kafka into the fallback, diffs run at
// snapshot pairs — TiDB read at T, the fallback held at exactly T by the applier's
// barrier only while its transactions open — and every one finds the two sides equal,
// with nothing for the re-check to resolve (both sides read at a snapshot). The pause,
// the fallback's position and the read view's age are reported.
func TestSnapshotPairsUnderLoad(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "pair", 3)
	db := testenv.UniqueName("pairs")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 2, 2, 2000
		lg.Rate = 150 // transactions/s, several rows each
	})
	importTs := load.ImportTs

	cfg := cdc.DefaultConfig()
	cfg.Changefeed.ID = "pairs"
	cfg.Changefeed.Brokers, cfg.Changefeed.Topics = []string{broker}, []string{topic}
	cfg.Changefeed.StartTs = importTs
	cfg.Downstream.DSN = down.Root
	cfg.Applier.MetaSchema = testenv.UniqueName("pm")
	cfg.Applier.SpillDir = t.TempDir()
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
	// A TSO the applier has passed: its barrier refuses, the pair is not opened, and its
	// connections go back to their pool.
	waitApplied(t, rep, importTs+1)
	if _, err := checker.OpenSnapshotPair(ctx, rep, checker.SnapshotPairConfig{TS: importTs, UpstreamDSN: upDSN, Downstream: down.DB, Kill: kill}); !errors.Is(err, cdc.ErrBarrierPassed) {
		t.Fatalf("a pair at a passed TSO: %v, want cdc.ErrBarrierPassed", err)
	}
	if inUse := down.DB.Stats().InUse; inUse != 0 {
		t.Fatalf("%d downstream connections still in use after a refused pair", inUse)
	}
	var pauses []time.Duration
	for i := 0; i < 3; i++ {
		time.Sleep(1500 * time.Millisecond) // let load and replication move on
		pair := openPair(t, ctx, rep, upDSN, down.DB, kill)
		dcfg := checker.DefaultConfig()
		dcfg.Tables = []string{db + ".*"}
		dcfg.MetaSchema = cfg.Applier.MetaSchema
		src := pair.Sources
		src.Meta = down.DB
		report, err := checker.NewDiff(dcfg, &src).Run(ctx)
		age := pair.Age()
		if cerr := pair.Close(); cerr != nil {
			t.Errorf("closing the pair: %v", cerr)
		}
		if err != nil {
			t.Fatalf("diff %d at %d: %v", i, pair.TS, err)
		}
		var rows, resolved int64
		for _, tr := range report.Tables {
			rows += tr.RowsChecked
			resolved += tr.DifferencesResolved
		}
		if !report.Equal || resolved != 0 || report.RecheckRounds != 0 || len(report.Tables) < 3 || rows < 4000 {
			t.Fatalf("diff %d at snapshot pair %d: equal=%v, %d tables, %d rows, resolved %d, re-check rounds %d",
				i, pair.TS, report.Equal, len(report.Tables), rows, resolved, report.RecheckRounds)
		}
		if !strings.HasPrefix(pair.Position, "mariadb-gtid:") {
			t.Fatalf("pair position %q", pair.Position)
		}
		pauses = append(pauses, pair.Pause)
		t.Logf("pair %d at %d: equal, %d rows, pause %v, view age at close %v, position %s", i, pair.TS, rows, pair.Pause, age.Round(time.Millisecond), pair.Position)
	}
	if ended, err := load.Ended(); ended {
		t.Fatalf("the load ended during the diffs: %v", err)
	}
	slices.Sort(pauses)
	t.Logf("applier pause per pair: min %v, max %v", pauses[0], pauses[len(pauses)-1])
}

// openPair opens a snapshot pair at the changefeed's newest global resolved ts,
// trying a newer one when the applier passed the first before its barrier was set.
func openPair(t *testing.T, ctx context.Context, rep *cdc.Replicator, upDSN string, down, kill *sql.DB) *checker.SnapshotPair {
	t.Helper()
	for attempt := 0; attempt < 20; attempt++ {
		st := rep.Status()
		ts := max(st.ResolvedTs, st.AppliedTs)
		if ts == 0 {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		pair, err := checker.OpenSnapshotPair(ctx, rep, checker.SnapshotPairConfig{TS: ts, UpstreamDSN: upDSN, Downstream: down, Kill: kill})
		if errors.Is(err, cdc.ErrBarrierPassed) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		return pair
	}
	t.Fatal("no snapshot pair in 20 attempts: the applier passed every resolved ts first")
	return nil
}

func waitFile(t testing.TB, path string, done <-chan error) uint64 {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			ts, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return ts
		}
		select {
		case err := <-done:
			t.Fatalf("loadgen ended before the import: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("no import within 2 minutes")
	return 0
}

func waitApplied(t *testing.T, rep *cdc.Replicator, ts uint64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for rep.Status().AppliedTs < ts {
		if time.Now().After(deadline) {
			t.Fatalf("the applier did not pass %d in a minute (at %d)", ts, rep.Status().AppliedTs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestCutoverCheckUnderLoad: the cutover check and snapshot points with the daemon's
// own parts — cdc.Replicator applying loadgen's changefeed through Kafka, the
// verification service with replicatorApplier — while the load goes on. After a clean
// full run, a check at TiDB's current TSO waits for the applier to apply it (the
// replicator's WaitApplied), verifies the keys the load changed since the full run's
// pair (the real dirty-key ledger) at a pair at or after it, and passes; its run is in
// the history as cutover-check. A snapshot point at the resolved ts is in the
// meta schema's ts_map with its position.
func TestCutoverCheckUnderLoad(t *testing.T) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "cutover", 3)
	db := testenv.UniqueName("cutover")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 2, 2, 2000
		lg.Rate = 100
	})
	cfg := verifyServeConfig(t, "cutover", upDSN, down, broker, topic, db, load.ImportTs)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	r, err := cdc.New(cfg.Parts().CDC, quiet)
	if err != nil {
		t.Fatal(err)
	}
	bd, err := bypass.New(cfg.Parts().Bypass, quiet)
	if err != nil {
		t.Fatal(err)
	}
	vs, err := verify.New(cfg.Parts().Verify, verify.Deps{Applier: daemon.Applier(r), BarrierPassed: cdc.ErrBarrierPassed, RecordTSMap: r.RecordTSMap, Bypass: bd, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return r.Run(rctx) })
	g.Go(func() error { return vs.Run(rctx) })
	g.Go(func() error { return bd.Run(rctx) })
	defer func() {
		stop()
		if err := g.Wait(); err != nil {
			t.Errorf("replicator or verification: %v", err)
		}
	}()
	waitApplied(t, r, load.ImportTs+1)
	for {
		if _, err := vs.UpstreamTSO(ctx); !errors.Is(err, verify.ErrNotRunning) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The full run's pair starts the window the check vouches for: bypass detection must
	// be watching by then, or the check rightly reports the window's first instants as
	// unwatched (it did in one CI run: the detector's first start came 21ms after the pair).
	for {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := bd.Cover(cctx)
		ccancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the bypass detector never watched: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	st, err := vs.Trigger(ctx, verify.Request{})
	if err != nil {
		t.Fatal(err)
	}
	full, err := st.Wait(ctx)
	if err != nil || full.Result != verify.ResultEqual {
		t.Fatalf("full run: %+v %v", full, err)
	}
	time.Sleep(time.Second) // the load changes keys after the full run's pair

	res, err := vs.CutoverCheck(ctx, verify.CutoverRequest{Now: true})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Passed || len(res.Failures) != 0 || res.RunID == "" || res.Pair.TS < res.UpstreamTS || res.UpstreamTS <= full.FirstTS ||
		!strings.HasPrefix(res.Pair.Position, "mariadb-gtid:") || res.KeysVerified == 0 || len(res.Tables) != len(full.Tables) {
		t.Fatalf("cutover check under load: %+v", res)
	}
	for _, ct := range res.Tables {
		keyless := strings.HasSuffix(ct.Table, ".keyless") // compared whole in a scoped run: no window
		if ct.LastFullRunID != full.RunID || ct.SinceTS != full.FirstTS || ct.Result != verify.ResultEqual ||
			!keyless && (ct.Bypass != checker.BypassIncluded || ct.LedgerFromTS != full.FirstTS || ct.LedgerUntilTS != res.Pair.TS || ct.LedgerKeys == 0 || ct.BypassWatched.IsZero()) {
			t.Fatalf("table evidence: %+v", ct)
		}
	}
	rec, _, err := vs.Get(ctx, res.RunID)
	if err != nil || rec.Trigger != verify.TriggerCutoverCheck || rec.Scope == verify.ScopeFull || rec.Result != verify.ResultEqual || rec.RowsChecked != res.KeysVerified {
		t.Fatalf("the check's run: %+v %v", rec, err)
	}
	t.Logf("cutover check: waited %v for %d, pair %d, %d keys verified in %d tables (full run: %d rows)",
		res.Waited.Round(time.Millisecond), res.UpstreamTS, res.Pair.TS, res.KeysVerified, len(res.Tables), full.RowsChecked)

	p, err := vs.SnapshotPoint(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var pos, source string
	err = down.QueryRow("SELECT downstream_pos, source FROM "+metaschema.Table(cfg.Applier.MetaSchema, "ts_map")+" WHERE changefeed=? AND upstream_ts=?",
		cfg.Changefeed.ID, p.TS).Scan(&pos, &source)
	if err != nil || pos != p.Position || source != "snapshot-point" || !strings.HasPrefix(pos, "mariadb-gtid:") || p.Pause <= 0 {
		t.Fatalf("snapshot point %+v; ts_map: %q %q %v", p, pos, source, err)
	}
	if ended, err := load.Ended(); ended {
		t.Fatalf("the load ended: %v", err)
	}
}

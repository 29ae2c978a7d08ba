package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestVerifyStress runs full and cdc-scoped verifications back to back under a saturating
// load for PARITY_STRESS_VERIFY (a Go duration; skipped without it) and fails on the
// first run that is not equal, after logging, for every reported key, the ledger's
// changes around the run's pair and the row on both sides: a reported mismatch must be
// real, and the sides hold the same data here. It is the tool that hunts a rare false
// mismatch; make test does not run it.
func TestVerifyStress(t *testing.T) {
	dur, err := time.ParseDuration(os.Getenv("PARITY_STRESS_VERIFY"))
	if err != nil {
		t.Skip("PARITY_STRESS_VERIFY (a duration) not set")
	}
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "stress", 3)
	db := testenv.UniqueName("stress")
	ctx, cancel := context.WithTimeout(context.Background(), dur+5*time.Minute)
	defer cancel()

	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 3, 12, 3000
		lg.Rate, lg.RowsPerTxn = 0, 20
		lg.Duration = dur + 4*time.Minute
		lg.CheckImages = true // a wrong image would make the fallback really differ
	})
	cfg := verifyServeConfig(t, "verify-stress", upDSN, down, broker, topic, db, load.ImportTs)
	cfg.Verify.TSMapInterval = time.Second
	// Scheduled runs overlap the manual ones, as in TestServeVerifyUnderLoad.
	cfg.Verify.Schedules = []verify.Schedule{{Name: "every-3s", Cron: "@every 3s"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := runServeInTest(t, ctx, cfg)
	defer srv.Close()
	srv.WaitApplied(load.ImportTs + 1)

	end := time.Now().Add(dur)
	runs, unconfirmed := 0, int64(0)
	for i := 0; time.Now().Before(end); i++ {
		var args []string
		if i%3 != 0 {
			args = []string{"--scope", "cdc"}
		}
		froms := verifiedTables(t, ctx, down.DB, cfg)
		rec := verifyCLI(t, srv.addr, args...)
		runs++
		unconfirmed += rec.Unconfirmed
		if rec.Result != verify.ResultEqual {
			t.Errorf("run %d %s (scope %s): %s, %d differences %v, error %q", i, rec.RunID, rec.Scope, rec.Result, rec.Differences, rec.DifferencesByClass, rec.Error)
			explainAndStop(t, ctx, upDSN, down, cfg, srv, load, rec, froms)
			return
		}
		if ended, err := load.Ended(); ended {
			t.Fatalf("the load ended: %v", err)
		}
	}
	t.Logf("%d runs equal over %v; %d differences gone when read again at their pair (unconfirmed)", runs, dur, unconfirmed)
}

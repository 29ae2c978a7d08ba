package loadgen

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestBigTransactionAgainstTiDB runs the big-transaction mode against TiDB and Kafka
// (small N, rows spread over 3 partitions by the index-value dispatcher, several
// read-back steps) and checks what it published: the DDL, every row of the one
// transaction with its real commit ts in its dispatcher's partition and before the
// resolved ts that covers it, and the rows equal to TiDB at that commit ts.
func TestBigTransactionAgainstTiDB(t *testing.T) {
	up := testenv.Upstream(t)
	topic := testenv.NewTopic(t, "bigtxn", 3)
	cfg := DefaultConfig()
	cfg.Upstream = testenv.Require(t, testenv.EnvUpstream)
	cfg.Brokers = []string{testenv.Kafka(t)}
	cfg.Topic = topic
	cfg.Database = up.Name
	cfg.Tables = 1
	cfg.AllTypes, cfg.Keyless = false, false
	cfg.Dispatcher = DispatchIndexValue
	cfg.Seed = 7
	const n = 2*bigReadRows + 345 // three read-back steps, the last one partial
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := RunBigTransaction(ctx, cfg, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("result %+v", res)
	if res.Transactions != 1 || res.Rows != n || res.FirstID != 1 || res.LastID != n {
		t.Fatalf("result %+v: want 1 transaction of %d rows, ids 1..%d", res, n, n)
	}
	if !(res.StartTs < res.CommitTs && res.CommitTs <= res.ResolvedTs) {
		t.Fatalf("want start %d < commit %d <= resolved %d", res.StartTs, res.CommitTs, res.ResolvedTs)
	}

	disp, _ := NewDispatcher(cfg.Dispatcher)
	tidb := openTiDB(t, cfg)
	desc := describeTables(t, ctx, tidb, up.Name, []string{"sbtest1"})
	got := newModel(desc)
	ddls := 0
	for p, recs := range readTopic(t, topic, 3) {
		var lastResolved uint64
		rowsHere := 0
		for _, rec := range recs {
			for _, ev := range rec.events {
				switch ev.Kind {
				case open.KindResolved:
					lastResolved = ev.CommitTs
				case open.KindDDL:
					if p == 0 && strings.HasPrefix(ev.Query, "CREATE TABLE") {
						ddls++
					}
				case open.KindRow:
					if ev.CommitTs != res.CommitTs || ev.Op != open.OpInsert {
						t.Fatalf("partition %d offset %d: %s at ts %d, want inserts at the commit ts %d", p, rec.offset, ev.Op, ev.CommitTs, res.CommitTs)
					}
					if lastResolved >= ev.CommitTs {
						t.Fatalf("partition %d offset %d: row after resolved %d", p, rec.offset, lastResolved)
					}
					if want, _ := disp.Dispatch(&ev, 3); want != p {
						t.Fatalf("partition %d offset %d: row belongs to partition %d", p, rec.offset, want)
					}
					if desc[ev.Table] == nil {
						t.Fatalf("partition %d offset %d: a row of table %s", p, rec.offset, ev.Table)
					}
					r, err := modelRow(desc[ev.Table], ev.Columns)
					if err != nil {
						t.Fatalf("partition %d offset %d: %v", p, rec.offset, err)
					}
					_ = got.add(ev.Table, r, 1)
					rowsHere++
				}
			}
		}
		if lastResolved != res.ResolvedTs {
			t.Fatalf("partition %d ends with resolved %d, want %d", p, lastResolved, res.ResolvedTs)
		}
		if rowsHere == 0 {
			t.Fatalf("partition %d got no rows: index-value dispatch should spread them", p)
		}
	}
	if ddls != 1 {
		t.Fatalf("%d CREATE TABLE DDLs on partition 0, want 1", ddls)
	}
	want := tidbRows(t, ctx, tidb, desc, res.CommitTs)
	if len(want["sbtest1"]) != n {
		t.Fatalf("TiDB has %d rows at the commit ts, want %d", len(want["sbtest1"]), n)
	}
	diffModel(t, "big transaction", got, want, res.CommitTs)
	if before := tidbRows(t, ctx, tidb, desc, res.CommitTs-1); len(before["sbtest1"]) != 0 {
		t.Fatalf("TiDB has %d rows just before the commit ts: not one transaction", len(before["sbtest1"]))
	}
}

func TestValidateBigTransaction(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.ValidateBigTransaction(10); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	cfg.Tables = 0
	cfg.Transactions = 5
	err := cfg.ValidateBigTransaction(0)
	if err == nil {
		t.Fatal("want errors")
	}
	for _, key := range []string{"big-transaction-rows:", "tables:", "transactions/duration/rate:"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error %q does not name %s", err, key)
		}
	}
}

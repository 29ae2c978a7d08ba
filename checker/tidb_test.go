package checker

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/testenv"
)

// TestTiDBRegionChunks: with TiDB upstream, chunks are cut at region boundaries even when
// the adaptive size would take the whole table in one chunk.
func TestTiDBRegionChunks(t *testing.T) {
	p := tidbPair(t)
	p.both(t, "CREATE TABLE rg (id BIGINT PRIMARY KEY, v VARCHAR(20))")
	var vals []string
	for i := 1; i <= 3000; i++ {
		vals = append(vals, fmt.Sprintf("(%d, 'v%d')", 2*i, i))
	}
	p.both(t, "INSERT INTO rg VALUES "+strings.Join(vals, ","))
	exec(t, p.up.DB, "SPLIT TABLE rg BETWEEN (0) AND (6000) REGIONS 6")
	exec(t, p.down.DB, "UPDATE rg SET v = 'changed' WHERE id = 1700", "DELETE FROM rg WHERE id = 6000")
	cfg := p.config(t, "rg")
	cfg.InitialChunkRows = 100000
	cfg.MaxChunkRows = 100000
	rep := run(t, cfg)
	tr := tableReport(t, rep, "rg")
	if tr.Chunks < 6 {
		t.Errorf("want at least one chunk per region (6), got %d", tr.Chunks)
	}
	if tr.RowsChecked != 3000 || tr.DownstreamRows != 2999 || tr.DifferencesTotal != 2 {
		t.Errorf("report: %+v", tr)
	}
}

// TestTiDBSnapshotRead reads the upstream at a TSO taken before a change: the diff sees
// the old data.
func TestTiDBSnapshotRead(t *testing.T) {
	p := tidbPair(t)
	p.both(t, "CREATE TABLE sn (id INT PRIMARY KEY, v INT)", "INSERT INTO sn VALUES (1, 1), (2, 2)")
	tso := fmt.Sprint(testenv.TiDBTSO(t, p.up.DB))
	exec(t, p.up.DB, "UPDATE sn SET v = 99 WHERE id = 2", "INSERT INTO sn VALUES (3, 3)")
	cfg := p.config(t, "sn")
	cfg.Upstream.Snapshot = tso
	if rep := run(t, cfg); !rep.Equal || rep.UpstreamSnapshot != tso || rep.DownstreamSnapshot != "" {
		t.Fatalf("at snapshot %s the tables are equal: %+v (snapshots %q, %q)", tso, rep.Tables, rep.UpstreamSnapshot, rep.DownstreamSnapshot)
	}
	cfg.Upstream.Snapshot = ""
	if rep := run(t, cfg); rep.Equal || rep.Tables[0].DifferencesTotal != 2 {
		t.Fatalf("without snapshot: %+v", rep.Tables)
	}
}

// TestTiDBChecksumChoice: tidb_checksum "auto" keeps the checksums in TiDB on the
// test environment's unistore and would push them down on TiKV; "pushdown" and "tidb"
// force the form; a MariaDB side never gets the pushdown form.
func TestTiDBChecksumChoice(t *testing.T) {
	p := tidbPair(t)
	ctx := context.Background()
	up, err := OpenDSN(ctx, p.up.DSN, 1, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	down, err := OpenDSN(ctx, p.down.DSN, 1, "", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	var store string
	if err := p.up.QueryRow("SELECT JSON_UNQUOTE(JSON_EXTRACT(@@tidb_config, '$.store'))").Scan(&store); err != nil {
		t.Fatal(err)
	}
	for mode, want := range map[TiDBChecksum]bool{
		TiDBChecksumAuto: store != "unistore", TiDBChecksumPushdown: true, TiDBChecksumTiDB: false,
	} {
		cfg := DefaultConfig()
		cfg.TiDBChecksum = mode
		r := &runner{cfg: &cfg, src: Sources{Upstream: up, Downstream: down}, log: slog.New(slog.DiscardHandler)}
		if err := r.choosePushdown(ctx); err != nil {
			t.Fatal(err)
		}
		if r.pushdown != [2]bool{want, false} {
			t.Errorf("tidb_checksum %q on store %s: pushdown %v, want [%v false]", mode, store, r.pushdown, want)
		}
	}
	if store != "unistore" {
		t.Logf("the upstream's store is %q, not the test environment's unistore", store)
	}
}

package loadgen

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/testenv"
)

// Config.CheckImages compares a transaction's published images with TiDB's rows at its
// commit ts: the true images pass; a wrong value, a row the changefeed says was deleted
// and one it says exists are each caught, naming the table, key, commit ts and column.
func TestCheckImagesCatchesWrongImages(t *testing.T) {
	up := testenv.Upstream(t)
	cfg := DefaultConfig()
	cfg.Upstream = testenv.Require(t, testenv.EnvUpstream)
	cfg.Brokers = []string{testenv.Kafka(t)}
	cfg.Topic = testenv.NewTopic(t, "images", 1)
	cfg.Database = up.Name
	cfg.Tables = 1
	cfg.CheckImages = true
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g := &Generator{cfg: cfg, log: slog.New(slog.DiscardHandler)}
	if _, err := g.setUp(ctx); err != nil {
		t.Fatal(err)
	}
	defer g.closeSetUp()
	var tbl *genTable
	for _, gt := range g.tables {
		if gt.meta.Name == "sbtest1" {
			tbl = gt
		}
	}
	if tbl == nil {
		t.Fatal("no sbtest1")
	}
	conn, err := g.up.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "INSERT INTO "+tbl.meta.QualifiedName()+" VALUES (7, 70, 'c-seven', 'pad-seven'), (8, 80, 'c-eight', 'pad-eight')"); err != nil {
		t.Fatal(err)
	}
	ts, err := lastCommitTs(ctx, conn, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A later change: the check reads at the commit ts, not now.
	if _, err := conn.ExecContext(ctx, "UPDATE "+tbl.meta.QualifiedName()+" SET k = 71 WHERE id = 7"); err != nil {
		t.Fatal(err)
	}
	imgs, err := g.readByID(ctx, conn, tbl, []int64{7, 8}, false)
	if err != nil || len(imgs) != 2 {
		t.Fatalf("read: %v %v", imgs, err)
	}
	seven := append([]open.Column(nil), imgs[7]...)
	kCol := -1
	for i, c := range seven {
		if c.Name == "k" {
			kCol = i
		}
	}
	// imgs[7] is the row now (k 71): at ts it was k 70.
	atTs := append([]open.Column(nil), seven...)
	atTs[kCol].Value = int64(70)
	ev := func(op open.Op, cols []open.Column) *open.Event {
		return &open.Event{Kind: open.KindRow, Schema: up.Name, Table: "sbtest1", Op: op, Columns: cols}
	}
	if err := g.checkImages(ctx, ts, []*open.Event{ev(open.OpInsert, atTs), ev(open.OpInsert, imgs[8])}); err != nil {
		t.Fatalf("true images: %v", err)
	}
	for _, tc := range []struct {
		name string
		evs  []*open.Event
		want string
	}{
		{"a later value", []*open.Event{ev(open.OpInsert, seven)}, "sbtest1 id 7 at commit ts " + itoa(ts) + ": column k differs"},
		{"deleted in the changefeed", []*open.Event{ev(open.OpInsert, imgs[8]), ev(open.OpDelete, imgs[8])}, "sbtest1 id 8 at commit ts " + itoa(ts) + ": deleted in the changefeed, present in TiDB"},
		{"absent in TiDB", []*open.Event{ev(open.OpInsert, withID(atTs, 9))}, "sbtest1 id 9 at commit ts " + itoa(ts) + ": present in the changefeed, absent in TiDB"},
	} {
		err := g.checkImages(ctx, ts, tc.evs)
		if !errors.Is(err, errImage) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func itoa(ts uint64) string { return strconv.FormatUint(ts, 10) }

// withID returns a copy of cols with the id column set to id.
func withID(cols []open.Column, id int64) []open.Column {
	out := append([]open.Column(nil), cols...)
	for i := range out {
		if out[i].Name == "id" {
			out[i].Value = id
		}
	}
	return out
}

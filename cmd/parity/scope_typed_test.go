package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestTypedKeyScopes: keys the applier records as TiCDC types them — a composite primary
// key (d, e, t) of a DECIMAL, an ENUM (its member index) and a DATETIME(3) (their text),
// listed in table order (e, d, t); a SET (its bits) with a TIMESTAMP(3) — are the rows the
// checker reads by key and classifies. Rows of real TiDB transactions are published to
// real Kafka as open-protocol events (images read from TiDB at their commit ts, as TiCDC
// sends them) and applied by the in-process applier; then divergences written straight
// into the fallback are found by a full diff with their classes (cdc for the rows the
// changefeed changed, imported for one it did not) and, by a since: diff, exactly the
// changed ones, reading only the changed keys.
func TestTypedKeyScopes(t *testing.T) {
	upDB := testenv.Upstream(t)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "typed", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// TIMESTAMP values in UTC on every side (the changefeed's time zone, the checker's).
	upDSN := testenv.DSN(t, testenv.EnvUpstream, upDB.Name, map[string]string{"time_zone": "'+00:00'"})
	up, err := sql.Open("mysql", upDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	downUTC, err := sql.Open("mysql", testenv.DSN(t, testenv.EnvDownstream, down.Name, map[string]string{"time_zone": "'+00:00'"}))
	if err != nil {
		t.Fatal(err)
	}
	defer downUTC.Close()
	both := func(stmts ...string) {
		t.Helper()
		for _, db := range []*sql.DB{up, downUTC} {
			for _, s := range stmts {
				if _, err := db.ExecContext(ctx, s); err != nil {
					t.Fatalf("%s: %v", s, err)
				}
			}
		}
	}
	both("CREATE TABLE typed (e ENUM('a','it''s','b\\\\c') NOT NULL, d DECIMAL(10,2) NOT NULL, t DATETIME(3) NOT NULL, v INT, PRIMARY KEY (d, e, t))",
		"CREATE TABLE st (s SET('p','q','r') NOT NULL, ts TIMESTAMP(3) NOT NULL, v INT, PRIMARY KEY (s, ts))")
	members := []string{"a", "it''s", "b\\\\c"}
	sets := []string{"", "p", "q", "p,q", "r", "p,r", "q,r", "p,q,r"}
	var rows, srows []string
	for i := 1; i <= 60; i++ {
		rows = append(rows, fmt.Sprintf("('%s', %d.%02d, '2024-02-29 10:%02d:%02d.%03d', %d)", members[i%3], i-30, i%4*25, i%60, i%7, i*7%1000, i))
	}
	for i := 1; i <= 16; i++ {
		srows = append(srows, fmt.Sprintf("('%s', '2037-12-31 23:59:%02d.%03d', %d)", sets[i%8], i, i*11%1000, i))
	}
	both("INSERT INTO typed VALUES "+strings.Join(rows, ","), "INSERT INTO st VALUES "+strings.Join(srows, ","))
	importTs := testenv.TiDBTSO(t, up)

	transport := &kafka.Transport{} // its own: closed at the end, so no connection outlives the test
	defer transport.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, BatchTimeout: time.Millisecond, RequiredAcks: kafka.RequireAll, Transport: transport}
	defer w.Close()
	enc := func() *open.Encoder {
		e, err := open.NewEncoder(open.DefaultEncoderConfig())
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	publish := func(msgs ...open.Message) {
		t.Helper()
		var km []kafka.Message
		for _, m := range msgs {
			km = append(km, kafka.Message{Key: m.Key, Value: m.Value})
		}
		if err := w.WriteMessages(ctx, km...); err != nil {
			t.Fatal(err)
		}
	}
	publish(enc().EncodeResolved(importTs))

	cfg := cdc.DefaultConfig()
	cfg.Changefeed.ID = "typed"
	cfg.Changefeed.Brokers, cfg.Changefeed.Topics = []string{broker}, []string{topic}
	cfg.Changefeed.StartTs = importTs
	cfg.Changefeed.SchemaMap = map[string]string{upDB.Name: down.Name}
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
	waitApplied(t, rep, importTs) // its first checkpoint: caught up from the start

	// One TiDB transaction: updates (one of the DECIMAL key's spelling -7.50), a delete and
	// an insert in typed, an update in st; its events as TiCDC sends them.
	tables := map[string]*upstream.Table{}
	for _, name := range []string{"typed", "st"} {
		if tables[name], err = upstream.LoadTable(ctx, up, upDB.Name, name); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := up.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	images := func(table, where string) [][]open.Column {
		t.Helper()
		tb := tables[table]
		r, err := conn.QueryContext(ctx, "SELECT "+tb.SelectList()+" FROM "+tb.QualifiedName()+" WHERE "+where+" ORDER BY 1, 2")
		if err != nil {
			t.Fatal(err)
		}
		imgs, _, err := upstream.ScanRows(r, tb, 0)
		if err != nil {
			t.Fatal(err)
		}
		return imgs
	}
	exec := func(q string) {
		t.Helper()
		if _, err := conn.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	exec("BEGIN PESSIMISTIC")
	updWhere := "v IN (3, 10, 22)"
	oldTyped := images("typed", updWhere)
	delTyped := images("typed", "v = 20")
	oldSt := images("st", "v = 5")
	exec("UPDATE typed SET v = v + 1000 WHERE " + updWhere)
	exec("DELETE FROM typed WHERE v = 20")
	exec("INSERT INTO typed VALUES ('b\\\\c', 99.90, '2025-12-31 23:59:59.999', 61)")
	exec("UPDATE st SET v = 500 WHERE v = 5")
	newTyped := images("typed", "v IN (1003, 1010, 1022)")
	insTyped := images("typed", "v = 61")
	newSt := images("st", "v = 500")
	exec("COMMIT")
	var info string
	if err := conn.QueryRowContext(ctx, "SELECT @@tidb_last_txn_info").Scan(&info); err != nil {
		t.Fatal(err)
	}
	var ti struct {
		CommitTs uint64 `json:"commit_ts"`
	}
	if err := json.Unmarshal([]byte(info), &ti); err != nil || ti.CommitTs <= importTs {
		t.Fatalf("commit ts from %q: %v", info, err)
	}
	ev := func(table string, op open.Op, cols, old []open.Column) *open.Event {
		return &open.Event{Kind: open.KindRow, CommitTs: ti.CommitTs, Schema: upDB.Name, Table: table, Op: op, Columns: cols, OldColumns: old}
	}
	e := enc()
	var evs []*open.Event
	for _, img := range delTyped {
		evs = append(evs, ev("typed", open.OpDelete, img, nil))
	}
	if len(oldTyped) != 3 || len(newTyped) != 3 || len(delTyped) != 1 || len(insTyped) != 1 || len(oldSt) != 1 || len(newSt) != 1 {
		t.Fatalf("images: %d/%d updated, %d deleted, %d inserted, st %d/%d", len(oldTyped), len(newTyped), len(delTyped), len(insTyped), len(oldSt), len(newSt))
	}
	for i := range newTyped {
		evs = append(evs, ev("typed", open.OpUpdate, newTyped[i], oldTyped[i]))
	}
	evs = append(evs, ev("typed", open.OpInsert, insTyped[0], nil), ev("st", open.OpUpdate, newSt[0], oldSt[0]))
	for _, x := range evs {
		if err := e.AppendRow(x); err != nil {
			t.Fatal(err)
		}
	}
	publish(e.Build()...)
	publish(enc().EncodeResolved(ti.CommitTs))
	waitApplied(t, rep, ti.CommitTs)

	// Divergences straight into the fallback: two rows the changefeed changed, one it
	// inserted, one of st it changed; one row it never touched.
	for _, q := range []string{
		"UPDATE typed SET v = -1 WHERE v = 1003",
		"DELETE FROM typed WHERE v = 61",
		"UPDATE typed SET v = -2 WHERE v = 30",
		"DELETE FROM st WHERE v = 500",
	} {
		if _, err := downUTC.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	kill, err := sql.Open("mysql", down.Root)
	if err != nil {
		t.Fatal(err)
	}
	defer kill.Close()
	diff := func(scope string) *checker.Report {
		t.Helper()
		pair := openPair(t, ctx, rep, upDSN, down.DB, kill)
		defer pair.Close()
		dcfg := checker.DefaultConfig()
		dcfg.Tables = []string{upDB.Name + ".*"}
		dcfg.Routes = []checker.Route{{From: upDB.Name, To: down.Name}}
		dcfg.MetaSchema = cfg.Applier.MetaSchema
		dcfg.Changefeed = checker.ChangefeedConfig{ID: cfg.Changefeed.ID, MetaSchema: cfg.Applier.MetaSchema}
		dcfg.Scope = scope
		dcfg.Logger = slog.New(slog.DiscardHandler)
		src := pair.Sources
		src.Meta = down.DB
		r, err := checker.NewDiff(dcfg, &src).Run(ctx)
		if err != nil {
			t.Fatalf("%s diff: %v", scope, err)
		}
		return r
	}
	found := func(r *checker.Report) (out []string) {
		for _, tr := range r.Tables {
			for _, d := range tr.Differences {
				var ks []string
				for _, kv := range d.Key {
					ks = append(ks, kv.Value)
				}
				out = append(out, fmt.Sprintf("%s %s (%s) %s", tr.Table, d.Kind, strings.Join(ks, ", "), d.Class))
			}
		}
		slices.Sort(out)
		return out
	}
	// Keys as the report writes them: (d, e, t) and (s, ts).
	changed := []string{
		"st missing ('p,r', '2037-12-31 23:59:05.055') cdc",
		"typed differing (-27.75, 'a', '2024-02-29 10:03:03.021') cdc",
		"typed missing (99.90, _utf8mb4 X'625C63', '2025-12-31 23:59:59.999') cdc",
	}
	want := append([]string{"typed differing (0.50, 'a', '2024-02-29 10:30:02.210') imported"}, changed...)
	slices.Sort(want)
	r := diff("full")
	if got := found(r); !slices.Equal(got, want) {
		t.Errorf("full diff:\n got  %q\n want %q", got, want)
	}
	r = diff(fmt.Sprintf("since:%d", importTs))
	if got := found(r); !slices.Equal(got, changed) {
		t.Errorf("since: diff:\n got  %q\n want %q", got, changed)
	}
	// typed: 3 keys updated, 1 deleted, 1 inserted (and deleted downstream); st: 1 updated
	// (deleted downstream).
	scoped := map[string][3]int64{"typed": {5, 4, 3}, "st": {1, 1, 0}} // keys, rows up, rows down
	for _, tr := range r.Tables {
		w := scoped[tr.Table]
		if tr.Scope != "keys" || tr.ScopeKeys != w[0] || tr.RowsChecked != w[1] || tr.DownstreamRows != w[2] {
			t.Errorf("%s since: scope %q %q, %d keys, %d/%d rows; want %d keys, %d/%d rows", tr.Table, tr.Scope, tr.ScopeNote, tr.ScopeKeys, tr.RowsChecked, tr.DownstreamRows, w[0], w[1], w[2])
		}
	}
}

package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// feed writes hand-crafted open-protocol records into a real Kafka topic, partition by
// partition, as TiCDC would.
type feed struct {
	t      *testing.T
	broker string
	topic  string
	parts  int
	enc    *open.Encoder
	ts     uint64
}

func newFeed(t *testing.T, parts int) *feed {
	t.Helper()
	enc, err := open.NewEncoder(open.EncoderConfig{MaxBatchSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	return &feed{t: t, broker: testenv.Kafka(t), topic: testenv.NewTopic(t, "cdc", parts), parts: parts, enc: enc,
		ts: tso.FromTime(time.Now().Add(-time.Hour))}
}

// next returns a fresh commit ts.
func (f *feed) next() uint64 {
	f.ts += 1 << 18 // +1ms
	return f.ts
}

func (f *feed) write(part int, msgs ...kafka.Message) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := f.writeOnce(ctx, part, msgs)
		if err == nil {
			return
		}
		// A fresh topic's partition can still be moving to its leader: Kafka rejects the
		// whole produce request then, so sending it again cannot duplicate anything.
		var kerr kafka.Error
		if errors.As(err, &kerr) && kerr.Temporary() && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		f.t.Fatalf("write %s/%d: %v", f.topic, part, err)
	}
}

func (f *feed) writeOnce(ctx context.Context, part int, msgs []kafka.Message) error {
	conn, err := kafka.DialLeader(ctx, "tcp", f.broker, f.topic, part)
	if err != nil {
		return fmt.Errorf("dial leader: %w", err)
	}
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(30 * time.Second))
	_, err = conn.WriteMessages(msgs...)
	return err
}

// rows writes row events to one partition, batched by the encoder.
func (f *feed) rows(part int, evs ...open.Event) {
	f.t.Helper()
	for i := range evs {
		if err := f.enc.AppendRow(&evs[i]); err != nil {
			f.t.Fatal(err)
		}
	}
	var msgs []kafka.Message
	for _, m := range f.enc.Build() {
		msgs = append(msgs, kafka.Message{Key: m.Key, Value: m.Value})
	}
	for len(msgs) > 0 {
		n := min(len(msgs), 200)
		f.write(part, msgs[:n]...)
		msgs = msgs[n:]
	}
}

// resolved broadcasts a resolved ts to every partition.
func (f *feed) resolved(ts uint64) {
	f.t.Helper()
	m := f.enc.EncodeResolved(ts)
	for p := 0; p < f.parts; p++ {
		f.write(p, kafka.Message{Key: m.Key, Value: m.Value})
	}
}

// ddl broadcasts a DDL to every partition.
func (f *feed) ddl(ts uint64, schema, table, query string, typ int) {
	f.t.Helper()
	m, err := f.enc.EncodeDDL(&open.Event{Kind: open.KindDDL, CommitTs: ts, Schema: schema, Table: table, Query: query, DDLType: typ})
	if err != nil {
		f.t.Fatal(err)
	}
	for p := 0; p < f.parts; p++ {
		f.write(p, kafka.Message{Key: m.Key, Value: m.Value})
	}
}

// Column helpers. pk marks a handle primary-key column.
func ci(name string, v int64, flags open.Flag) open.Column {
	return open.Column{Name: name, Type: open.TypeLonglong, Flags: flags | open.FlagBinary, Value: v}
}

func cs(name string, v any) open.Column {
	return open.Column{Name: name, Type: open.TypeVarchar, Flags: open.FlagNullable, Value: v}
}

const pk = open.FlagHandleKey | open.FlagPrimaryKey

func ins(ts uint64, schema, table string, cols ...open.Column) open.Event {
	return open.Event{Kind: open.KindRow, CommitTs: ts, Schema: schema, Table: table, Op: open.OpInsert, Columns: cols}
}

func del(ts uint64, schema, table string, cols ...open.Column) open.Event {
	return open.Event{Kind: open.KindRow, CommitTs: ts, Schema: schema, Table: table, Op: open.OpDelete, Columns: cols}
}

func upd(ts uint64, schema, table string, old, cols []open.Column) open.Event {
	return open.Event{Kind: open.KindRow, CommitTs: ts, Schema: schema, Table: table, Op: open.OpUpdate, Columns: cols, OldColumns: old}
}

// testConfig returns a config for a replicator of f into down, with its own meta schema.
func testConfig(t *testing.T, f *feed, down *testenv.DB) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Changefeed.ID = "test"
	cfg.Changefeed.Brokers = []string{f.broker}
	cfg.Changefeed.Topics = []string{f.topic}
	cfg.Downstream.DSN = down.Root
	cfg.Applier.Workers = 3
	cfg.Applier.BatchRows = 4
	cfg.Applier.SpillDir = t.TempDir()
	cfg.Applier.MetaSchema = testenv.UniqueName("pm")
	cfg.Applier.RetryBackoff = 20 * time.Millisecond
	t.Cleanup(func() {
		if os.Getenv("PARITY_TEST_KEEP") == "1" {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = down.ExecContext(ctx, "DROP DATABASE IF EXISTS "+ident.Quote(cfg.Applier.MetaSchema))
	})
	return cfg
}

// running is a replicator running in the background of a test.
type running struct {
	r      *Replicator
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Config, hooks *testHooks) *running {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	r.hooks = hooks
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{r: r, cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- r.Run(ctx) }()
	t.Cleanup(func() { run.stop(t) })
	return run
}

// stop cancels the replicator and returns Run's result (once).
func (run *running) stop(t *testing.T) error {
	t.Helper()
	run.cancel()
	select {
	case err, ok := <-run.done:
		if ok {
			close(run.done)
		}
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("replicator did not stop within 60s")
		return nil
	}
}

// wait blocks until the replicator applied ts, failing the test if Run returned.
func (run *running) wait(t *testing.T, ts uint64) {
	t.Helper()
	select {
	case <-run.r.AppliedNotify(ts):
	case err := <-run.done:
		run.done <- err
		t.Fatalf("replicator stopped before applying %d: %v", ts, err)
	case <-time.After(60 * time.Second):
		t.Fatalf("replicator did not apply ts %d within 60s; status %+v", ts, run.r.Status())
	}
}

// result waits for Run to return on its own and returns its error.
func (run *running) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-run.done:
		run.done <- err
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("replicator did not stop within 60s")
		return nil
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// dump returns every row of table, one line per row — each column's text as the server
// sends it (NULL for NULL) joined by "|" — sorted; read with internal/testenv's reader.
func dump(t *testing.T, db *sql.DB, schema, table string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	desc, err := testenv.DescribeTable(ctx, db, schema, table)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	err = testenv.ScanRows(ctx, db, desc, func(r testenv.Row) error {
		parts := make([]string, len(r))
		for i, v := range r {
			parts[i] = v.Text
			if v.Null {
				parts[i] = "NULL"
			}
		}
		out = append(out, strings.Join(parts, "|"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func exec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s:\ngot  %q\nwant %q", what, got, want)
	}
}

var errCrash = errors.New("simulated crash")

// crashAt returns hooks that fail the first time point fires.
func crashAt(point hookPoint) *testHooks {
	fired := false
	return &testHooks{f: func(p hookPoint) error {
		if p == point && !fired {
			fired = true
			return fmt.Errorf("%w at %s", errCrash, p)
		}
		return nil
	}}
}

package cdc

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// keylessRig drives the applier directly (no Kafka) so a test can choose the exact
// rounds a process runs between simulated crashes.
type keylessRig struct {
	t    *testing.T
	cfg  Config
	down *testenv.DB
	meta *meta
}

func newKeylessRig(t *testing.T) *keylessRig {
	t.Helper()
	down := testenv.Downstream(t)
	cfg := DefaultConfig()
	cfg.Changefeed.ID = "test"
	cfg.Applier.Workers = 3
	cfg.Applier.BatchRows = 4
	cfg.Applier.MetaSchema = testenv.UniqueName("pm")
	cfg.Applier.RetryBackoff = 20 * time.Millisecond
	db, err := openDB("downstream", down.Root, map[string]string{"time_zone": "'+00:00'"}, 5)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP DATABASE IF EXISTS " + ident.Quote(cfg.Applier.MetaSchema))
		db.Close()
	})
	m := newMeta(db, cfg.Applier.MetaSchema, cfg.Changefeed.ID, 30*time.Second)
	if err := m.migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &keylessRig{t: t, cfg: cfg, down: down, meta: m}
}

// process is one life of the replicator: state loaded from the meta schema, and a
// buffer holding what it re-read from Kafka (rows above the checkpoint).
type rigProcess struct {
	rig   *keylessRig
	ap    *applier
	buf   *buffer
	saved savedState
}

func (k *keylessRig) start(evs ...open.Event) *rigProcess {
	k.t.Helper()
	st, err := k.meta.load(context.Background())
	if err != nil {
		k.t.Fatal(err)
	}
	buf, err := newBuffer(k.t.TempDir(), 1<<20)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() { buf.close() })
	for i := range evs {
		if evs[i].CommitTs <= st.appliedTs {
			continue // dropped at ingest
		}
		ev := evs[i]
		if err := buf.add(&ev, uint64(i+1)); err != nil {
			k.t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(testWriter{k.t}, nil))
	ap := newApplier(k.meta.db, k.meta, k.cfg, log, nil, st.tableProgress, nil)
	return &rigProcess{rig: k, ap: ap, buf: buf, saved: st}
}

// round applies every buffered row <= ts; with checkpoint it then records the
// checkpoint as the coordinator does (without: the process dies before that).
func (p *rigProcess) round(ts uint64, checkpoint bool) {
	t := p.rig.t
	t.Helper()
	ctx := context.Background()
	if _, err := p.ap.applyRows(ctx, p.buf, ts); err != nil {
		t.Fatal(err)
	}
	if !checkpoint {
		return
	}
	p.buf.release(ts)
	if err := p.rig.meta.saveCheckpoint(ctx, ts, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// TestKeylessProgressNeverMovesBack: a keyless table's rows up to T3 committed with its
// table progress, then the process died before the checkpoint (still T1). The restart
// re-reads those rows and, as its partitions' resolved ts arrive one by one, may apply a
// round at T2 < T3 first. That round must skip the rows (they are <= T3) and must not
// lower the table's progress to T2 — neither in memory (the same process's next round)
// nor in the meta schema (the next restart) — or the rows in (T2, T3] are applied twice.
func TestKeylessProgressNeverMovesBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart bool // crash again after the round at T2 (its checkpoint recorded)
	}{
		{"same process", false},
		{"next restart", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newKeylessRig(t)
			s := k.down.Name
			exec(t, k.down.DB, "CREATE TABLE nk (a BIGINT, b VARCHAR(32))")
			const t1, t2, t3 = 100, 200, 300
			evs := []open.Event{
				ins(t2, s, "nk", ci("a", 2, 0), cs("b", "dup")),
				ins(t2, s, "nk", ci("a", 2, 0), cs("b", "dup")),
				ins(t3, s, "nk", ci("a", 3, 0), cs("b", "x")),
				del(t3, s, "nk", ci("a", 2, 0), cs("b", "dup")),
				ins(t3, s, "nk", ci("a", 3, 0), cs("b", "y")),
			}
			want := []string{"2|dup", "3|x", "3|y"}
			if err := k.meta.saveCheckpoint(context.Background(), t1, nil, nil, nil); err != nil {
				t.Fatal(err)
			}
			// First life: one round up to T3, killed before its checkpoint.
			k.start(evs...).round(t3, false)
			equal(t, "nk after the first life", dump(t, k.down.DB, s, "nk"), want)

			p := k.start(evs...)
			if got := p.saved.tableProgress[tableKey{s, "nk"}]; got != t3 {
				t.Fatalf("restart: table progress %d, want %d", got, t3)
			}
			p.round(t2, true)
			equal(t, "nk after the round at T2", dump(t, k.down.DB, s, "nk"), want)
			if tc.restart {
				p = k.start(evs...)
			}
			p.round(t3, true)
			equal(t, "nk after the round at T3", dump(t, k.down.DB, s, "nk"), want)
			var progress uint64
			if err := k.down.QueryRow("SELECT applied_ts FROM " + ident.Quote(k.cfg.Applier.MetaSchema) + ".table_progress WHERE table_name='nk'").Scan(&progress); err != nil || progress != t3 {
				t.Fatalf("table progress %d (%v), want %d", progress, err, t3)
			}
		})
	}
}

// TestKeylessStatementBytes: a keyless table's inserts of one transaction are split by
// statement size as well as by row count: 40 rows of 1 MiB in one transaction would be
// one 40 MiB INSERT at batch-rows 256, beyond MariaDB's default max_allowed_packet
// (16 MiB; the test server allows 256 MiB, so the test watches the largest packet the
// applier writes: the driver sends a statement in packets of up to 16 MiB).
func TestKeylessStatementBytes(t *testing.T) {
	k := newKeylessRig(t)
	k.cfg.Applier.BatchRows = 256
	mc, err := mysql.ParseDSN(k.down.Root)
	if err != nil {
		t.Fatal(err)
	}
	mc.Params = map[string]string{"time_zone": "'+00:00'"}
	var biggest atomic.Int64
	mc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		return &writeSizeConn{Conn: c, max: &biggest}, err
	}
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	t.Cleanup(func() { db.Close() })
	k.meta.db = db
	s := k.down.Name
	exec(t, k.down.DB, "CREATE TABLE big (a BIGINT, b LONGTEXT)")
	var evs []open.Event
	var want []string
	for i := range 40 {
		v := strings.Repeat(string(rune('a'+i%26)), 1<<20)
		evs = append(evs, ins(100, s, "big", ci("a", int64(i), 0), cs("b", v)))
		want = append(want, fmt.Sprintf("%d|%d", i, len(v)))
	}
	k.start(evs...).round(100, true)
	var got []string
	rows, err := k.down.Query("SELECT a, LENGTH(b) FROM " + ident.Table(s, "big") + " ORDER BY a")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var a, n int
		if err := rows.Scan(&a, &n); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d|%d", a, n))
	}
	equal(t, "big", got, want)
	if b := biggest.Load(); b > 2*maxStatementBytes {
		t.Errorf("the applier wrote a %d-byte packet; statements must stay near %d bytes", b, maxStatementBytes)
	}
}

// writeSizeConn records the largest single write to a connection (the driver writes one
// protocol packet per call).
type writeSizeConn struct {
	net.Conn
	max *atomic.Int64
}

func (c *writeSizeConn) Write(p []byte) (int, error) {
	for {
		m := c.max.Load()
		if int64(len(p)) <= m || c.max.CompareAndSwap(m, int64(len(p))) {
			break
		}
	}
	return c.Conn.Write(p)
}

// TestCheckpointLag reads a changefeed's lag from the meta schema as parity diff does:
// the time since its applied checkpoint's commit ts; a changefeed without a checkpoint is
// an error naming it.
func TestCheckpointLag(t *testing.T) {
	k := newKeylessRig(t)
	now := time.Now()
	ts := uint64(now.Add(-90*time.Second).UnixMilli()) << 18
	if err := k.meta.saveCheckpoint(context.Background(), ts, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
	lag, err := CheckpointLag(context.Background(), k.meta.db, k.cfg.Applier.MetaSchema, k.cfg.Changefeed.ID, now)
	if err != nil || lag < 89*time.Second || lag > 91*time.Second {
		t.Fatalf("lag %s (%v), want 90s", lag, err)
	}
	if _, err := CheckpointLag(context.Background(), k.meta.db, k.cfg.Applier.MetaSchema, "other", now); err == nil || !strings.Contains(err.Error(), `"other"`) {
		t.Fatalf("unknown changefeed: want an error naming it, got %v", err)
	}
}

package cdc

import (
	"context"
	"log/slog"
	"testing"
	"time"

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
	db, err := openDB(down.Root, map[string]string{"time_zone": "'+00:00'"}, 5)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = db.Exec("DROP DATABASE IF EXISTS " + ident.Quote(cfg.Applier.MetaSchema))
		db.Close()
	})
	m := &meta{db: db, schema: ident.Quote(cfg.Applier.MetaSchema), changefeed: cfg.Changefeed.ID, timeout: 30 * time.Second}
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
	ap := &applier{db: k.meta.db, meta: k.meta, cfg: k.cfg, log: log, tableProgress: st.tableProgress}
	return &rigProcess{rig: k, ap: ap, buf: buf, saved: st}
}

// round applies every buffered row <= ts; with checkpoint it then records the
// checkpoint as the coordinator does (without: the process dies before that).
func (p *rigProcess) round(ts uint64, checkpoint bool) {
	t := p.rig.t
	t.Helper()
	ctx := context.Background()
	if err := p.ap.applyRows(ctx, p.buf, ts); err != nil {
		t.Fatal(err)
	}
	if !checkpoint {
		return
	}
	p.buf.release(ts)
	if err := p.rig.meta.saveCheckpoint(ctx, ts, nil); err != nil {
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
			if err := k.meta.saveCheckpoint(context.Background(), t1, nil); err != nil {
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

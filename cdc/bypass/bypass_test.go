package bypass

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	_ "github.com/tidb-parity/parity/cdc" // registers the "cdc" component: write_marker
	"github.com/tidb-parity/parity/internal/bypasslog"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

// RandomServerID is a binlog client server id for a test: tests running at once on one
// fallback must not share one (the server drops the older client).
func RandomServerID() uint32 {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return 100000 + binary.LittleEndian.Uint32(b[:])%1000000000
}

// running is a Detector run by a test.
type running struct {
	d    *Detector
	stop func() error
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	d, err := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	var stopErr error
	r := &running{d: d, stop: func() error {
		once.Do(func() { cancel(); stopErr = <-done })
		return stopErr
	}}
	t.Cleanup(func() { _ = r.stop() })
	deadline := time.Now().Add(30 * time.Second)
	for d.Status().State != "reading" {
		select {
		case err := <-done:
			t.Fatalf("detector stopped: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("detector not reading after 30s: %+v", d.Status())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return r
}

// stored returns the detections stored for table, as "kind key" lines in binlog order.
func stored(t *testing.T, db *testenv.DB, meta, changefeed, schema, table string) []bypasslog.Write {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, err := bypasslog.Read(ctx, db, meta, changefeed, schema, table, time.Time{}, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	slices.SortStableFunc(ws, func(a, b bypasslog.Write) int {
		if c := strings.Compare(a.File, b.File); c != 0 {
			return c
		}
		if a.Pos != b.Pos {
			return int(int64(a.Pos) - int64(b.Pos))
		}
		return a.Seq - b.Seq
	})
	return ws
}

func lines(ws []bypasslog.Write) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w.Kind+" "+w.Text)
	}
	return out
}

// waitFor waits up to 5 s (the promise) for want to be the stored detections of table.
func waitFor(t *testing.T, db *testenv.DB, meta, cf, schema, table string, want []string) []bypasslog.Write {
	t.Helper()
	begin := time.Now()
	for {
		ws := stored(t, db, meta, cf, schema, table)
		if slices.Equal(lines(ws), want) {
			t.Logf("detected within %v: %q", time.Since(begin).Round(time.Millisecond), want[len(want)-1])
			return ws
		}
		if time.Since(begin) > 5*time.Second {
			t.Fatalf("after 5s the detections of %s.%s are\n%q\nwant\n%q", schema, table, lines(ws), want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func exec(t *testing.T, db *testenv.DB, qs ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, q := range qs {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// markedTx writes like parity's applier: the marker first, then rows, in one transaction.
func markedTx(t *testing.T, db *testenv.DB, meta, cf string, qs ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, strings.ReplaceAll(bypasslog.MarkSQL, "%s", ident.Quote(meta)), cf, "apply-0"); err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestDetectsHandWrittenChanges runs a Detector against the real fallback: hand-written
// inserts, updates (one changing the key) and deletes of watched tables are recorded
// within 5 s with table, key, GTID and position, a multi-statement transaction records
// each row, marked transactions (parity's) and other schemas never are, and a restart
// resumes where it stopped: what was written while it was down is recorded once, and
// nothing is recorded twice.
func TestDetectsHandWrittenChanges(t *testing.T) {
	data := testenv.Downstream(t)
	meta := testenv.NewDB(t, testenv.EnvDownstream, "pm")
	other := testenv.Downstream(t)
	exec(t, data,
		"CREATE TABLE t (id INT UNSIGNED NOT NULL PRIMARY KEY, v VARCHAR(20))",
		"CREATE TABLE k2 (a VARCHAR(10) NOT NULL, b MEDIUMINT UNSIGNED NOT NULL, e ENUM('x','y') NOT NULL, c INT, PRIMARY KEY (a, b, e))",
		"CREATE TABLE nk (x INT)")
	exec(t, other, "CREATE TABLE t (id INT PRIMARY KEY)")
	cf := "cf-" + testenv.UniqueName("b")
	cfg := DefaultConfig()
	cfg.Enabled, cfg.ServerID = true, RandomServerID()
	cfg.DSN = testenv.DSN(t, testenv.EnvDownstream, "", nil)
	cfg.MetaSchema, cfg.Changefeed = meta.Name, cf
	cfg.Schemas = []string{data.Name}
	r := start(t, cfg)

	// parity's own writes (as the applier and repair write them) are never recorded.
	markedTx(t, data, meta.Name, cf, "INSERT INTO t VALUES (1, 'parity')", "INSERT INTO t VALUES (9, 'parity')")
	markedTx(t, data, meta.Name, cf, "UPDATE t SET v = 'p2' WHERE id = 1")

	want := []string{"insert id=2"}
	exec(t, data, "INSERT INTO t VALUES (2, 'hand')")
	ws := waitFor(t, meta, meta.Name, cf, data.Name, "t", want)
	if w := ws[0]; w.GTID == "" || w.File == "" || w.Pos == 0 || w.EventTime.IsZero() || w.ServerID == 0 ||
		!slices.Equal(w.Columns, []string{"id"}) || len(w.Values) != 1 || string(w.Values[0]) != "2" {
		t.Fatalf("detection %+v: want GTID, position, time, server id and key id=2", w)
	}
	want = append(want, "update id=1")
	exec(t, data, "UPDATE t SET v = 'hand' WHERE id = 1")
	waitFor(t, meta, meta.Name, cf, data.Name, "t", want)
	want = append(want, "delete id=9")
	exec(t, data, "DELETE FROM t WHERE id = 9")
	waitFor(t, meta, meta.Name, cf, data.Name, "t", want)
	want = append(want, "update id=2", "update id=4000000000") // a key change: both keys
	exec(t, data, "UPDATE t SET id = 4000000000 WHERE id = 2")
	waitFor(t, meta, meta.Name, cf, data.Name, "t", want)

	// A statement of several rows: every row, one GTID; another transaction another.
	exec(t, data, "INSERT INTO k2 VALUES ('a''b', 16777215, 'y', 1), ('c', 1, 'x', 2)", "INSERT INTO nk VALUES (1)")
	k2 := waitFor(t, meta, meta.Name, cf, data.Name, "k2", []string{"insert a='a''b', b=16777215, e='y'", "insert a='c', b=1, e='x'"})
	nk := waitFor(t, meta, meta.Name, cf, data.Name, "nk", []string{"insert (no primary or NOT NULL unique key)"})
	if k2[0].GTID == nk[0].GTID || k2[0].GTID != k2[1].GTID {
		t.Fatalf("GTIDs %q %q (one statement) and %q (another transaction)", k2[0].GTID, k2[1].GTID, nk[0].GTID)
	}

	// Another schema (not in bypass.schemas) is not watched.
	exec(t, other, "INSERT INTO t VALUES (1)")

	st := r.d.Status()
	if st.Detections != 8 || len(st.Recent) != 8 || st.Recent[0].Table != data.Name+".nk" || st.Recent[0].GTID == "" || st.LastDetectionTime.IsZero() {
		t.Fatalf("status %+v: want 8 detections, the newest of %s.nk", st, data.Name)
	}

	// A restart: writes made while the detector is down are found once it is back, and
	// nothing is recorded twice; parity's writes meanwhile never are.
	if err := r.stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	exec(t, data, "INSERT INTO t VALUES (3, 'while down')")
	markedTx(t, data, meta.Name, cf, "DELETE FROM t WHERE id = 3")
	exec(t, data, "INSERT INTO t VALUES (5, 'while down')")
	r = start(t, cfg)
	want = append(want, "insert id=3", "insert id=5")
	waitFor(t, meta, meta.Name, cf, data.Name, "t", want)
	exec(t, data, "DELETE FROM t WHERE id = 5")
	want = append(want, "delete id=5")
	waitFor(t, meta, meta.Name, cf, data.Name, "t", want)
	if got := stored(t, meta, meta.Name, cf, other.Name, "t"); len(got) != 0 {
		t.Fatalf("unwatched schema recorded: %q", lines(got))
	}
	if err := r.stop(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("stop: %v", err)
	}
}

func TestMembers(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"enum('a','b')", []string{"a", "b"}},
		{"set('x','it''s','')", []string{"x", "it's", ""}},
		{"enum('a,b','c)')", []string{"a,b", "c)"}},
	} {
		if got := members(c.in); !slices.Equal(got, c.want) {
			t.Errorf("members(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestColumnText(t *testing.T) {
	for _, c := range []struct {
		col  column
		v    any
		want string
	}{
		{column{unsigned: true}, int8(-1), "255"},
		{column{}, int8(-1), "-1"},
		{column{unsigned: true}, int16(-1), "65535"},
		{column{unsigned: true, medium: true}, int32(-1), "16777215"},
		{column{unsigned: true}, int32(-1), "4294967295"},
		{column{unsigned: true}, int64(-1), "18446744073709551615"},
		{column{enum: []string{"a", "b"}}, int64(2), "b"},
		{column{enum: []string{"a", "b", "c"}, set: true}, int64(5), "a,c"},
		{column{}, float64(1.5), "1.5"},
		{column{}, "2024-01-02 03:04:05.5", "2024-01-02 03:04:05.5"},
		{column{}, 2024, "2024"},
	} {
		if got := string(c.col.text(c.v)); got != c.want {
			t.Errorf("%+v.text(%T %v) = %q, want %q", c.col, c.v, c.v, got, c.want)
		}
	}
	if got := c2(column{}.text(nil)); got != "<nil>" {
		t.Errorf("NULL = %s", got)
	}
}

func c2(b []byte) string {
	if b == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%q", b)
}

package tso_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

func TestTimeRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		ts   uint64
		want string
	}{
		{0, "1970-01-01 00:00:00.000 UTC"},
		{1 << 18, "1970-01-01 00:00:00.001 UTC"},
		{463267587686400000, "2026-01-01 00:00:00.000 UTC"},
		{463267587686400000 + 262143, "2026-01-01 00:00:00.000 UTC"}, // logical part ignored
	} {
		if got := tso.Format(tc.ts); got != tc.want {
			t.Errorf("Format(%d) = %s, want %s", tc.ts, got, tc.want)
		}
	}
	now := time.UnixMilli(time.Now().UnixMilli())
	if got := tso.Time(tso.FromTime(now)); !got.Equal(now) {
		t.Errorf("Time(FromTime(%v)) = %v", now, got)
	}
	if s := tso.Seconds(tso.FromTime(time.Unix(1700000000, 500e6))); s != 1700000000.5 {
		t.Errorf("Seconds = %v", s)
	}
}

func TestHint(t *testing.T) {
	gc := &mysql.MySQLError{Number: 8055, Message: "snapshot is older than GC safe point"}
	err := tso.Hint(fmt.Errorf("select: %w", gc))
	if !errors.Is(err, gc) {
		t.Fatal("Hint must keep the error chain")
	}
	if got := err.Error(); got == fmt.Errorf("select: %w", gc).Error() {
		t.Fatalf("no advice: %s", got)
	}
	other := errors.New("x")
	if tso.Hint(other) != other || tso.Hint(nil) != nil {
		t.Fatal("other errors pass through")
	}
	if !tso.IsGCSafePoint(fmt.Errorf("select: %w", gc)) || tso.IsGCSafePoint(other) || tso.IsGCSafePoint(nil) ||
		tso.IsGCSafePoint(&mysql.MySQLError{Number: 1146}) {
		t.Fatal("IsGCSafePoint")
	}
}

// TestAt reads a real TiDB at a TSO before a change, and checks that a released
// connection reads the present again.
func TestAt(t *testing.T) {
	up := testenv.Upstream(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	up.DB.SetMaxOpenConns(1) // the released connection is the one read next
	tbl := "`" + up.Name + "`.t"
	mustExec(t, up.DB, "CREATE TABLE "+tbl+" (id INT PRIMARY KEY)")
	mustExec(t, up.DB, "INSERT INTO "+tbl+" VALUES (1)")
	before := testenv.TiDBTSO(t, up.DB)
	mustExec(t, up.DB, "INSERT INTO "+tbl+" VALUES (2)")
	conn, err := up.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	release, err := tso.At(ctx, conn, before)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+tbl).Scan(&n); err != nil || n != 1 {
		t.Fatalf("at the TSO: %d rows, %v; want 1", n, err)
	}
	release()
	conn.Close()
	if err := up.DB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+tbl).Scan(&n); err != nil || n != 2 {
		t.Fatalf("after release: %d rows, %v; want 2 (the pooled connection still reads the past)", n, err)
	}
	// A TSO from the future is refused by TiDB with an error, not silently accepted.
	conn2, err := up.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	if _, err := tso.At(ctx, conn2, tso.FromTime(time.Now().Add(time.Hour))); err == nil {
		t.Log("TiDB accepted a future TSO") // informational: versions differ
	}
}

func mustExec(t *testing.T, db *sql.DB, q string) {
	t.Helper()
	if _, err := db.Exec(q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// Package tso is TiDB's timestamp (TSO): converting it to and from wall time, and reading
// TiDB at one — a session pinned with @@tidb_snapshot, reset before its connection goes
// back to the pool, with TiDB's "older than the GC safe point" error explained.
//
// It is its own leaf package because the applier (completing handle-key-only rows), the
// load generator (import and read-back), the checker (snapshot reads) and the daemon's
// status all need the same three rules, and none of them may import another.
package tso

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"
)

// physicalShift is where a TSO's physical part (milliseconds since the Unix epoch)
// starts; the low 18 bits are the logical counter.
const physicalShift = 18

// Time returns the wall-clock time of a TSO's physical part.
func Time(ts uint64) time.Time { return time.UnixMilli(int64(ts >> physicalShift)) }

// FromTime returns the TSO of t with logical part 0.
func FromTime(t time.Time) uint64 { return uint64(t.UnixMilli()) << physicalShift }

// Seconds returns a TSO's physical part as fractional seconds since the Unix epoch (a
// metric's value).
func Seconds(ts uint64) float64 { return float64(ts>>physicalShift) / 1000 }

// Format renders a TSO's time as "2006-01-02 15:04:05.000 UTC".
func Format(ts uint64) string {
	return Time(ts).UTC().Format("2006-01-02 15:04:05.000") + " UTC"
}

// ErrGCSafePoint is TiDB's error 8055: the snapshot is older than the GC safe point.
const ErrGCSafePoint = 8055

// IsGCSafePoint reports whether err is (or wraps) TiDB's error 8055.
func IsGCSafePoint(err error) bool {
	var me *mysql.MySQLError
	return err != nil && errors.As(err, &me) && me.Number == ErrGCSafePoint
}

// Hint explains TiDB's error 8055 (row versions at the snapshot were garbage-collected)
// with what to do about it; other errors are returned as they are.
func Hint(err error) error {
	if IsGCSafePoint(err) {
		return fmt.Errorf("%w (the row versions at that TSO were garbage-collected: raise tidb_gc_life_time above the time the read needs, or read a newer TSO)", err)
	}
	return err
}

// resetTimeout bounds the reset of a session's snapshot when its connection is released.
const resetTimeout = 10 * time.Second

// At pins conn to read TiDB as of ts (SET @@tidb_snapshot). The returned release must be
// called before conn is closed (returned to its pool): it reads the present again, and
// when that fails it marks the connection bad so the pool discards it instead of handing
// a session still reading the past to someone else. release runs with its own bound even
// after ctx ended.
func At(ctx context.Context, conn *sql.Conn, ts uint64) (release func(), err error) {
	if _, err := conn.ExecContext(ctx, "SET @@tidb_snapshot = ?", strconv.FormatUint(ts, 10)); err != nil {
		return func() {}, fmt.Errorf("read at ts %d: %w", ts, Hint(err))
	}
	return func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resetTimeout)
		defer cancel()
		if _, err := conn.ExecContext(rctx, "SET @@tidb_snapshot = ''"); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}, nil
}

// Current returns TiDB's current TSO: the start ts of a new transaction on db (TiDB's
// @@tidb_current_ts), within timeout.
func Current(ctx context.Context, db *sql.DB, timeout time.Duration) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("reading TiDB's current TSO: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var ts uint64
	if err := tx.QueryRowContext(ctx, "SELECT @@tidb_current_ts").Scan(&ts); err != nil {
		return 0, fmt.Errorf("reading TiDB's current TSO: %w", err)
	}
	if ts == 0 {
		return 0, errors.New("reading TiDB's current TSO: @@tidb_current_ts is 0 (is upstream.dsn TiDB?)")
	}
	return ts, nil
}

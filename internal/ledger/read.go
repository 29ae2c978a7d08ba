package ledger

// read.go is the reader's side of the contract: what a reader may trust (Bounds), the
// keys of one table changed in a window (Scan, Read), and when the applier first caught
// up with real time (CaughtUp, from the ts-map). The checker reads through it; the
// applier never does.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/tso"
)

// CheckpointTable is the applier's checkpoint in the meta schema:
//
//	checkpoint (changefeed PRIMARY KEY, applied_ts, ...)
//
// A reader trusts the ledger up to applied_ts.
const CheckpointTable = "checkpoint"

// TSMapTable is the ts-map in the meta schema:
//
//	ts_map (changefeed, upstream_ts, downstream_pos, wall_time, source)
//	  PRIMARY KEY (changefeed, upstream_ts)
//
// A row says that at wall_time the fallback held the upstream exactly at upstream_ts:
// the applier writes one between rounds every ts-map-interval, verification one at every
// snapshot pair. wall_time holds UTC digits, written by sessions in the server's default
// time zone (TIMESTAMP(6)); it is pruned with the ledger.
const TSMapTable = "ts_map"

// Querier runs queries: a *sql.DB, *sql.Conn or *sql.Tx (a snapshot transaction reads
// the ledger as it was at its snapshot).
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

var (
	// ErrNoLedger is returned when the changefeed has no ledger a reader may trust: no
	// ledger_range row (the ledger is, or was, off) or no checkpoint.
	ErrNoLedger = errors.New("no dirty-key ledger")
	// ErrNotCovered is returned for a window the ledger does not cover: it starts before
	// the ledger does (since_ts), or ends after the applied checkpoint.
	ErrNotCovered = errors.New("window not covered by the dirty-key ledger")
)

// Bounds are what a reader may trust of a changefeed's ledger: every change with commit
// ts in (Since, Applied].
type Bounds struct {
	Since, Applied uint64
}

// Covers reports, as ErrNotCovered naming both, whether the window (from, until] is
// within b.
func (b Bounds) Covers(from, until uint64) error {
	switch {
	case from < b.Since:
		return fmt.Errorf("%w: it starts at %d, before the ledger does (since_ts %d)", ErrNotCovered, from, b.Since)
	case until > b.Applied:
		return fmt.Errorf("%w: it ends at %d, after the applied checkpoint %d", ErrNotCovered, until, b.Applied)
	}
	return nil
}

// Reader reads one changefeed's ledger.
type Reader struct {
	// Q runs the queries (on the fallback, where the meta schema lives).
	Q Querier
	// MetaSchema is the applier's meta schema (applier.meta-schema).
	MetaSchema string
	// Changefeed is the changefeed's id.
	Changefeed string
	// Timeout bounds each query (0: only ctx does).
	Timeout time.Duration
}

func (r Reader) table(name string) string { return ident.Table(r.MetaSchema, name) }

func (r Reader) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if r.Timeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, r.Timeout)
}

// queryRow reads one row; ok is false when there is none.
func (r Reader) queryRow(ctx context.Context, q string, args []any, dest ...any) (ok bool, err error) {
	qctx, cancel := r.ctx(ctx)
	defer cancel()
	rows, err := r.Q.QueryContext(qctx, q, args...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	if !rows.Next() {
		return false, rows.Err()
	}
	if err := rows.Scan(dest...); err != nil {
		return false, err
	}
	return true, rows.Close()
}

// Bounds reads what a reader may trust now (see Bounds).
func (r Reader) Bounds(ctx context.Context) (Bounds, error) {
	var b Bounds
	ok, err := r.queryRow(ctx, "SELECT since_ts FROM "+r.table(RangeTable)+" WHERE changefeed = ?", []any{r.Changefeed}, &b.Since)
	if err != nil {
		return b, fmt.Errorf("read where the ledger of changefeed %s starts: %w", r.Changefeed, err)
	}
	if !ok {
		return b, fmt.Errorf("%w of changefeed %s in %s (applier.ledger off, or off for a while)", ErrNoLedger, r.Changefeed, r.MetaSchema)
	}
	ok, err = r.queryRow(ctx, "SELECT applied_ts FROM "+r.table(CheckpointTable)+" WHERE changefeed = ?", []any{r.Changefeed}, &b.Applied)
	if err != nil {
		return b, fmt.Errorf("read the checkpoint of changefeed %s: %w", r.Changefeed, err)
	}
	if !ok {
		return b, fmt.Errorf("%w: changefeed %s has no checkpoint in %s", ErrNoLedger, r.Changefeed, r.MetaSchema)
	}
	return b, nil
}

// scanPage is how many ledger rows one query reads (each query has its own timeout).
const scanPage = 256

// Scan calls fn with every entry of the upstream table schema.table whose commit ts is
// in (from, until], in the order of the rows that hold them (a key may come more than
// once: once per round that changed it). It refuses, with ErrNotCovered, a window the
// ledger does not cover, checked before and again after reading (pruning moves since_ts
// up before it deletes rows, so a window still covered afterwards lost none).
func (r Reader) Scan(ctx context.Context, schema, table string, from, until uint64, fn func(Entry) error) error {
	if until <= from {
		return nil
	}
	check := func() error {
		b, err := r.Bounds(ctx)
		if err != nil {
			return err
		}
		if err := b.Covers(from, until); err != nil {
			return fmt.Errorf("ledger of changefeed %s, table %s.%s: %w", r.Changefeed, schema, table, err)
		}
		return nil
	}
	if err := check(); err != nil {
		return err
	}
	q := "SELECT max_ts, part, min_ts, key_count, entries FROM " + r.table(Table) +
		" WHERE changefeed = ? AND schema_name = ? AND table_name = ? AND max_ts > ? AND min_ts <= ?" +
		" AND (max_ts > ? OR (max_ts = ? AND part > ?)) ORDER BY max_ts, part LIMIT " + fmt.Sprint(scanPage)
	afterTs, afterPart := from, -1
	for {
		type part struct {
			maxTs, minTs uint64
			n            int
			blob         []byte
		}
		var got []part
		err := func() error {
			qctx, cancel := r.ctx(ctx)
			defer cancel()
			rows, err := r.Q.QueryContext(qctx, q, r.Changefeed, schema, table, from, until, afterTs, afterTs, afterPart)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var p part
				var partNo int
				if err := rows.Scan(&p.maxTs, &partNo, &p.minTs, &p.n, &p.blob); err != nil {
					return err
				}
				afterTs, afterPart = p.maxTs, partNo
				got = append(got, p)
			}
			return rows.Err()
		}()
		if err != nil {
			return fmt.Errorf("read the ledger of %s.%s: %w", schema, table, err)
		}
		for _, p := range got {
			es, err := Decode(p.blob, p.minTs)
			if err != nil {
				return fmt.Errorf("ledger row of %s.%s at max_ts %d: %w", schema, table, p.maxTs, err)
			}
			if len(es) != p.n {
				return fmt.Errorf("ledger row of %s.%s at max_ts %d: %w: key_count %d, %d entries", schema, table, p.maxTs, ErrCorrupt, p.n, len(es))
			}
			for _, e := range es {
				if e.CommitTs <= from || e.CommitTs > until {
					continue
				}
				if err := fn(e); err != nil {
					return err
				}
			}
		}
		if len(got) < scanPage {
			break
		}
	}
	return check()
}

// Read returns each key of schema.table changed in (from, until] with the commit ts of
// its last change there, sorted by key (Compact). See Scan.
func Read(ctx context.Context, r Reader, schema, table string, from, until uint64) ([]Entry, error) {
	var out []Entry
	err := r.Scan(ctx, schema, table, from, until, func(e Entry) error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return Compact(out), nil
}

// CaughtUp is when the applier first came within a lag of real time.
type CaughtUp struct {
	// Ts is the upstream_ts of the first ts-map row (by upstream_ts) whose wall_time is
	// within the lag of the TSO's time; 0 when none is (Found false).
	Ts    uint64
	Found bool
	// Rows counts the ts-map rows read (0: the ts-map is empty, and when the applier
	// caught up is unknown).
	Rows int
	// First is the upstream_ts of the oldest ts-map row (0 when empty): the ts-map is
	// pruned with the ledger, so a catch-up older than it is not seen.
	First uint64
}

// CaughtUp reads the ts-map in upstream_ts order up to the first row at which the
// fallback was within lag of real time (wall_time - the TSO's time <= lag).
func (r Reader) CaughtUp(ctx context.Context, lag time.Duration) (CaughtUp, error) {
	var c CaughtUp
	qctx, cancel := r.ctx(ctx)
	defer cancel()
	// wall_time as the digits it was written as: UTC, written by a session in the
	// server's default time zone (the applier's meta sessions set none), whatever time
	// zone this session has.
	rows, err := r.Q.QueryContext(qctx, "SELECT upstream_ts, CAST(COALESCE(CONVERT_TZ(wall_time, @@session.time_zone, @@global.time_zone), wall_time) AS CHAR) FROM "+
		r.table(TSMapTable)+" WHERE changefeed = ? ORDER BY upstream_ts", r.Changefeed)
	if err != nil {
		return c, fmt.Errorf("read the ts-map of changefeed %s: %w", r.Changefeed, err)
	}
	defer rows.Close()
	for rows.Next() {
		var ts uint64
		var wall string
		if err := rows.Scan(&ts, &wall); err != nil {
			return c, fmt.Errorf("read the ts-map of changefeed %s: %w", r.Changefeed, err)
		}
		at, err := time.ParseInLocation("2006-01-02 15:04:05.999999", strings.TrimSpace(wall), time.UTC)
		if err != nil {
			return c, fmt.Errorf("ts-map of changefeed %s at upstream_ts %d: wall_time %q: %w", r.Changefeed, ts, wall, err)
		}
		if c.Rows == 0 {
			c.First = ts
		}
		c.Rows++
		if at.Sub(tso.Time(ts)) <= lag {
			c.Ts, c.Found = ts, true
			return c, nil
		}
	}
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("read the ts-map of changefeed %s: %w", r.Changefeed, err)
	}
	return c, nil
}

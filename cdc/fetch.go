package cdc

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
)

// rowFetcher completes handle-key-only row events. TiCDC's large-message-handle-option
// "handle-key-only" sends a row that does not fit in max-message-bytes with its handle-key
// columns only ("ohk"); the consumer must read the row from TiDB at the event's commit ts
// (ticdc.md §1.8). A delete needs nothing more than its key; an insert or an update gets
// its new image from SELECT ... WHERE <handle> = <key> with @@tidb_snapshot = commit ts.
// An update's old image keeps only the handle key, which is all the applier needs of it
// (it tells whether the update moved the row).
type rowFetcher struct {
	db      *sql.DB
	timeout time.Duration
	retries int
	backoff time.Duration
	log     *slog.Logger
	fetched *atomic.Int64 // rows read since start (the Replicator's counter)
}

func newRowFetcher(cfg Config, log *slog.Logger, fetched *atomic.Int64) (*rowFetcher, error) {
	tz, _ := sessionTimeZone(cfg.Changefeed.TimeZone)
	// TIMESTAMP values in the zone TiCDC renders them in (the apply sessions use it too).
	db, err := openDB("upstream", cfg.Upstream.DSN, map[string]string{"time_zone": "'" + tz + "'"}, 4)
	if err != nil {
		return nil, err
	}
	return &rowFetcher{db: db, timeout: cfg.Applier.QueryTimeout, retries: cfg.Applier.MaxRetries,
		backoff: cfg.Applier.RetryBackoff, log: log, fetched: fetched}, nil
}

func (f *rowFetcher) close() error { return f.db.Close() }

// tableCache holds, for one partition's stream, the upstream tables read for its
// handle-key-only events. An entry read for an event at commit ts lo serves events at
// lo or later until the stream carries a DDL: TiCDC writes a DDL to every partition after
// the rows before it and before the rows after it, so no schema change between lo and a
// later event's ts can go unseen. An event older than lo (a TiCDC re-delivery) reads the
// table again at its own ts. Any DDL empties the cache.
type tableCache map[[2]string]cachedTable

type cachedTable struct {
	t  *upstream.Table
	lo uint64
}

// complete replaces every handle-key-only insert and update of evs by the full row.
// cache belongs to the partition whose stream evs come from.
func (f *rowFetcher) complete(ctx context.Context, evs []open.Event, cache tableCache) error {
	for i := range evs {
		ev := &evs[i]
		if ev.Kind == open.KindDDL {
			clear(cache)
			continue
		}
		if ev.Kind != open.KindRow || !ev.OnlyHandleKey || ev.Op == open.OpDelete {
			continue
		}
		cols, err := f.fetch(ctx, ev, cache)
		if err != nil {
			return fmt.Errorf("reading the row of a handle-key-only %s event of %s.%s at commit ts %d from the upstream: %w",
				ev.Op, ev.Schema, ev.Table, ev.CommitTs, err)
		}
		ev.Columns = cols
		ev.OnlyHandleKey = false
		f.fetched.Add(1)
	}
	return nil
}

// fetch reads ev's row at its commit ts, retrying transient errors.
func (f *rowFetcher) fetch(ctx context.Context, ev *open.Event, cache tableCache) ([]open.Column, error) {
	backoff := f.backoff
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, f.timeout)
		cols, err := f.fetchOnce(actx, ev, cache)
		cancel()
		if err == nil {
			return cols, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !upstreamTransient(err) || attempt >= f.retries {
			return nil, err
		}
		f.log.Warn("transient upstream error, retrying", "table", ev.Schema+"."+ev.Table, "attempt", attempt+1, "backoff", backoff, "err", err)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (f *rowFetcher) fetchOnce(ctx context.Context, ev *open.Event, cache tableCache) (cols []open.Column, err error) {
	conn, err := f.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	snapshot := false
	defer func() {
		if snapshot {
			// The connection goes back to the pool: it must read the present again.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			if _, rerr := conn.ExecContext(rctx, "SET @@tidb_snapshot = ''"); rerr != nil {
				_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // discard it instead
			}
			cancel()
		}
		_ = conn.Close()
	}()
	if _, err := conn.ExecContext(ctx, "SET @@tidb_snapshot = ?", strconv.FormatUint(ev.CommitTs, 10)); err != nil {
		return nil, fmt.Errorf("read at ts %d: %w", ev.CommitTs, snapshotHint(err))
	}
	snapshot = true
	// The table as it was at the commit ts (information_schema follows @@tidb_snapshot).
	key := [2]string{ev.Schema, ev.Table}
	c, ok := cache[key]
	if !ok || ev.CommitTs < c.lo {
		t, err := upstream.LoadTable(ctx, conn, ev.Schema, ev.Table)
		if err != nil {
			return nil, snapshotHint(err)
		}
		c = cachedTable{t: t, lo: ev.CommitTs}
		if !ok {
			cache[key] = c
		}
	}
	cols, err = upstream.FetchRow(ctx, conn, c.t, ev.Columns)
	return cols, snapshotHint(err)
}

// snapshotHint explains TiDB's "snapshot is older than GC safe point".
func snapshotHint(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 8055 {
		return fmt.Errorf("%w (the row versions at the event's commit ts were garbage-collected: raise tidb_gc_life_time above the changefeed's lag)", err)
	}
	return err
}

// upstreamTransient reports whether an upstream read error is worth retrying: the
// downstream's transient errors, plus TiDB's TiKV/PD unavailability and timeouts.
func upstreamTransient(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number >= 9001 && me.Number <= 9007 {
		return true
	}
	return isTransient(err)
}

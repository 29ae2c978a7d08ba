package cdc

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/retry"
	"github.com/tidb-parity/parity/internal/tso"
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
	ctr     *counters // the Replicator's: rows read, retries
}

func newRowFetcher(cfg Config, log *slog.Logger, ctr *counters) (*rowFetcher, error) {
	tz, _ := sessionTimeZone(cfg.Changefeed.TimeZone)
	// TIMESTAMP values in the zone TiCDC renders them in (the apply sessions use it too).
	db, err := openDB("upstream", cfg.Upstream.DSN, map[string]string{"time_zone": "'" + tz + "'"}, 4)
	if err != nil {
		return nil, err
	}
	return &rowFetcher{db: db, timeout: cfg.Applier.QueryTimeout, retries: cfg.Applier.MaxRetries,
		backoff: cfg.Applier.RetryBackoff, log: log, ctr: ctr}, nil
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
		f.ctr.fetched.Add(1)
	}
	return nil
}

// fetch reads ev's row at its commit ts, retrying transient errors.
func (f *rowFetcher) fetch(ctx context.Context, ev *open.Event, cache tableCache) ([]open.Column, error) {
	p := retry.Policy{MaxRetries: f.retries, Backoff: f.backoff, Timeout: f.timeout}
	var cols []open.Column
	err := p.Do(ctx, func(ctx context.Context) (err error) {
		cols, err = f.fetchOnce(ctx, ev, cache)
		return err
	}, func(attempt int, wait time.Duration, err error) {
		f.ctr.upRetries.Add(1)
		f.log.Warn("transient upstream error, retrying", "table", ev.Schema+"."+ev.Table, "attempt", attempt, "backoff", wait, "err", err)
	})
	return cols, err
}

func (f *rowFetcher) fetchOnce(ctx context.Context, ev *open.Event, cache tableCache) (cols []open.Column, err error) {
	conn, err := f.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	release, err := tso.At(ctx, conn, ev.CommitTs)
	if err != nil {
		return nil, err
	}
	defer release() // before Close: the connection goes back to the pool reading the present
	// The table as it was at the commit ts (information_schema follows @@tidb_snapshot).
	key := [2]string{ev.Schema, ev.Table}
	c, ok := cache[key]
	if !ok || ev.CommitTs < c.lo {
		t, err := upstream.LoadTable(ctx, conn, ev.Schema, ev.Table)
		if err != nil {
			return nil, tso.Hint(err)
		}
		c = cachedTable{t: t, lo: ev.CommitTs}
		if !ok {
			cache[key] = c
		}
	}
	cols, err = upstream.FetchRow(ctx, conn, c.t, ev.Columns)
	return cols, tso.Hint(err)
}

package checker

// snapshot.go owns snapshot pairs: the upstream TiDB read at a TSO T (tidb_snapshot) and
// the downstream held at exactly T by the applier's barrier, where transactions are
// opened WITH CONSISTENT SNAPSHOT and the downstream's own position is read, after which
// replication goes on: it pauses only for the barrier. It must not know the applier
// beyond the Barrierer interface (checker never imports cdc), nor tables or runs: it
// hands back Sources that a run reads through.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tidb-parity/parity/internal/barrier"
	"github.com/tidb-parity/parity/internal/position"
	"github.com/tidb-parity/parity/internal/tso"
)

// Barrierer holds the downstream exactly at an upstream TSO while fn runs: every change
// of the changefeed with commit ts <= ts applied, none after, and nothing else written
// by the applier until fn returns. cdc.Replicator satisfies it.
//
// fn may run on another goroutine (the applier's), and Barrier may return ctx's error
// as soon as ctx ends, while fn still finishes there: call it through
// internal/barrier.Hold, which waits for fn, when what fn touches is read or released
// after Barrier returns.
type Barrierer interface {
	Barrier(ctx context.Context, ts uint64, fn func(ctx context.Context) error) error
}

// SnapshotPairConfig says where a snapshot pair reads.
type SnapshotPairConfig struct {
	// TS is the upstream TSO both sides read at. The applier must not have applied
	// beyond it yet (its barrier then refuses), and TiDB's GC must still keep it.
	// Default: none (required).
	TS uint64
	// UpstreamDSN is the TiDB read at TS. Default: none (required).
	UpstreamDSN string
	// Downstream is the fallback's pool: Conns of its connections become the snapshot
	// transactions (they return to the pool when the pair is closed). Default: none
	// (required).
	Downstream *sql.DB
	// Kill is a pool on the fallback outside those transactions, on which a query that
	// outlives its timeout is stopped. Default: none (required).
	Kill *sql.DB
	// Conns is the number of connections (so concurrent queries) on each side.
	// Default: 4.
	Conns int
	// QueryTimeout bounds every query of the pair. Default: 5m.
	QueryTimeout time.Duration
}

// Validate reports every problem with its key path.
func (c SnapshotPairConfig) Validate() error {
	var errs []error
	if c.TS == 0 {
		errs = append(errs, errors.New("ts: required"))
	}
	if c.UpstreamDSN == "" {
		errs = append(errs, errors.New("upstream-dsn: required"))
	}
	if c.Downstream == nil {
		errs = append(errs, errors.New("downstream: required"))
	}
	if c.Kill == nil {
		errs = append(errs, errors.New("kill: required"))
	}
	if c.Conns < 0 || c.Conns > 256 {
		errs = append(errs, fmt.Errorf("conns: must be between 1 and 256, got %d", c.Conns))
	}
	if c.QueryTimeout < 0 {
		errs = append(errs, fmt.Errorf("query-timeout: must not be negative, got %s", c.QueryTimeout))
	}
	return errors.Join(errs...)
}

// SnapshotPair is an open snapshot pair.
type SnapshotPair struct {
	// Sources read upstream at TS and downstream at exactly TS (Meta is the caller's to
	// set).
	Sources Sources
	// TS is the upstream TSO of both sides.
	TS uint64
	// Position is the downstream's replication position at TS (internal/position; ""
	// without a binary log).
	Position string
	// Pause is how long replication waited for the pair: the time inside the barrier.
	Pause time.Duration
	// OpenedAt is when the downstream's read view was created; a view kept open long
	// grows InnoDB's history list, so callers rotate pairs past a maximum age.
	OpenedAt time.Time

	up    *DSNSource
	conns []*sql.Conn
}

// Age is how long the downstream's read view has been open.
func (p *SnapshotPair) Age() time.Duration { return time.Since(p.OpenedAt) }

// OpenSnapshotPair opens a snapshot pair at cfg.TS. The downstream connections are taken
// before the barrier and their transactions started inside it, so the pause is a few
// statements per connection.
func OpenSnapshotPair(ctx context.Context, b Barrierer, cfg SnapshotPairConfig) (_ *SnapshotPair, err error) {
	if cfg.Conns == 0 {
		cfg.Conns = 4
	}
	if cfg.QueryTimeout == 0 {
		cfg.QueryTimeout = 5 * time.Minute
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("snapshot pair: %w", err)
	}
	ts := strconv.FormatUint(cfg.TS, 10)
	p := &SnapshotPair{TS: cfg.TS}
	defer func() { // p, not the result: a failed open returns nil
		if err != nil {
			_ = p.Close()
		}
	}()
	if p.up, err = OpenDSN(ctx, cfg.UpstreamDSN, cfg.Conns, ts, cfg.QueryTimeout); err != nil {
		return nil, fmt.Errorf("snapshot pair at %d: upstream: %w", cfg.TS, tso.Hint(err))
	}
	for range cfg.Conns {
		c, err := cfg.Downstream.Conn(ctx)
		if err != nil {
			return nil, fmt.Errorf("snapshot pair at %d: downstream: %w", cfg.TS, err)
		}
		p.conns = append(p.conns, c)
	}
	_, err = barrier.Hold(ctx, b.Barrier, cfg.TS, func(ctx context.Context) error {
		start := time.Now()
		defer func() { p.Pause = time.Since(start) }()
		ctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
		defer cancel()
		for i, c := range p.conns {
			if _, err := c.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
			if _, err := c.ExecContext(ctx, "START TRANSACTION WITH CONSISTENT SNAPSHOT"); err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
		}
		p.OpenedAt = time.Now()
		pos, err := position.Read(ctx, p.conns[0])
		if err != nil {
			return err
		}
		p.Position = pos
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot pair at %d: downstream: %w", cfg.TS, err)
	}
	down, err := newConnSource(ctx, p.conns, connSourceConfig{Desc: "downstream@" + ts, Snapshot: ts, Kill: cfg.Kill})
	if err != nil {
		return nil, fmt.Errorf("snapshot pair at %d: %w", cfg.TS, err)
	}
	p.Sources = Sources{Upstream: p.up, Downstream: down}
	return p, nil
}

// Close ends the downstream's transactions (releasing its read view), returns its
// connections to their pool and closes the upstream's.
func (p *SnapshotPair) Close() error {
	var errs []error
	for _, c := range p.conns {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := c.ExecContext(ctx, "ROLLBACK"); err != nil {
			errs = append(errs, err)
		}
		cancel()
		if err := c.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	p.conns = nil
	if p.up != nil {
		errs = append(errs, p.up.Close())
		p.up = nil
	}
	return errors.Join(errs...)
}

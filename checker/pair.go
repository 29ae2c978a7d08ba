package checker

// pair.go owns the two sides of a run and what is known of them: each side's source and
// flavour, where a TiDB side computes its checksums (pushdown), whether a TiDB side
// compares strings as bytes (no new collations), the smaller max_allowed_packet, and
// whether each side reads at a snapshot (and which). Every query on the compared servers
// goes through withSide or withBoth, which bound it by the query timeout and stop it on
// the server when it outlives it. It must not know tables, chunks or run state: it runs
// the queries it is given.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Sources are the connections of a run: the two sides and the meta database (writable,
// normally the downstream server) that holds the run state.
type Sources struct {
	Upstream   Source
	Downstream Source
	Meta       *sql.DB
}

// sourcePair is the two sides of a run (see the file comment).
type sourcePair struct {
	src    [2]Source
	flavor [2]Flavor
	// snapshot names the point each side reads at ("": live data), from the source
	// (snapshotReader): a DSN opened at a tidb_snapshot, or connections the caller opened
	// inside a barrier and labelled.
	snapshot [2]string
	// pushdown, per side: a TiDB side computes checksums in the form its coprocessor
	// evaluates (see tablePlan.Pushdown).
	pushdown [2]bool
	// binaryStrings, per side: a TiDB bootstrapped without new collations, which compares
	// every string as binary bytes (NO PAD) whatever collation its columns declare.
	binaryStrings [2]bool
	// packet is the smaller max_allowed_packet of the two servers (tablePlan.FitEncoding).
	packet int64
	// timeout bounds every query (Config.QueryTimeout).
	timeout time.Duration
}

// newSourcePair pairs up and down, knowing only what the sources say of themselves.
func newSourcePair(up, down Source, timeout time.Duration) *sourcePair {
	p := &sourcePair{src: [2]Source{up, down}, flavor: [2]Flavor{up.Flavor(), down.Flavor()}, timeout: timeout}
	for s, src := range p.src {
		if r, ok := src.(snapshotReader); ok {
			p.snapshot[s] = r.readsAt()
		}
	}
	return p
}

// openPair pairs the sources and asks the servers what the comparison depends on.
func openPair(ctx context.Context, cfg *Config, up, down Source, log *slog.Logger) (*sourcePair, error) {
	p := newSourcePair(up, down, cfg.QueryTimeout)
	if err := p.choosePushdown(ctx, cfg.TiDBChecksum, log); err != nil {
		return nil, err
	}
	if err := p.readCollations(ctx, log); err != nil {
		return nil, err
	}
	if err := p.readPacket(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// atSnapshot reports whether both sides read at a snapshot: reading again reads the same
// data.
func (p *sourcePair) atSnapshot() bool {
	return p.snapshot[upSide] != "" && p.snapshot[downSide] != ""
}

// anyTiDB reports whether a side is TiDB.
func (p *sourcePair) anyTiDB() bool { return len(p.tidbSides()) > 0 }

// tidbSides returns the sides whose server is TiDB.
func (p *sourcePair) tidbSides() []pairSide {
	var out []pairSide
	for _, s := range []pairSide{upSide, downSide} {
		if p.flavor[s] == FlavorTiDB {
			out = append(out, s)
		}
	}
	return out
}

// withSide runs fn on a connection of one side under the per-query timeout. A query
// still running when the timeout (or the run's cancellation) ends it is stopped on the
// server (queryKiller), and the call fails even if the query returned a result after
// that: a killed statement may end early without an error (SLEEP on TiDB), and a kill
// can cut a result short.
func (p *sourcePair) withSide(ctx context.Context, s pairSide, fn func(context.Context, Querier) error) error {
	src := p.src[s]
	q, release, err := src.Acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	qctx := ctx
	if k, ok := src.(queryKiller); ok {
		var stop func()
		qctx, stop = k.killOnDone(ctx, q)
		defer stop()
	}
	err = fn(qctx, q)
	switch {
	case ctx.Err() == nil:
		return err
	case parent.Err() != nil:
		return parent.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w (%s query_timeout %s)", err, s, p.timeout)
	}
	// Stopped on the server: the query's own error (interrupted, or none) says less.
	return fmt.Errorf("%w (%s query_timeout %s)", context.DeadlineExceeded, s, p.timeout)
}

// withBoth holds one connection of each side (always acquired upstream first, so workers
// cannot deadlock on the per-side pools).
func (p *sourcePair) withBoth(ctx context.Context, fn func(ctx context.Context, up, down Querier) error) error {
	return p.withSide(ctx, upSide, func(ctx context.Context, uq Querier) error {
		return p.withSide(ctx, downSide, func(ctx context.Context, dq Querier) error {
			return fn(ctx, uq, dq)
		})
	})
}

// checksumPushdown reports whether a source of flavour f computes its checksums in the form
// TiDB pushes down to its coprocessor, under mode (Config.TiDBChecksum; "auto" or "" reads
// TiDB's store through q: pushdown unless it is the embedded unistore). When the store
// cannot be read (hidden under TiDB's security-enhanced mode, as on TiDB Cloud, which runs
// on TiKV) it assumes TiKV: pushdown is true and storeErr says why, for the caller to log.
func checksumPushdown(ctx context.Context, q Querier, f Flavor, mode TiDBChecksum) (pushdown bool, storeErr error) {
	if f != FlavorTiDB {
		return false, nil
	}
	switch mode {
	case TiDBChecksumPushdown:
		return true, nil
	case TiDBChecksumTiDB:
		return false, nil
	}
	var store sql.NullString
	if err := queryRow(ctx, q, "SELECT JSON_UNQUOTE(JSON_EXTRACT(@@tidb_config, '$.store'))", &store); err != nil {
		return true, fmt.Errorf("read the TiDB store type: %w", err)
	}
	return store.String != "unistore", nil
}

// choosePushdown decides, for each TiDB side, where its checksums are computed
// (Config.TiDBChecksum): "auto" pushes them down to the coprocessor when TiDB's store is
// TiKV (or when the store cannot be read), and keeps them in TiDB on the embedded
// unistore.
func (p *sourcePair) choosePushdown(ctx context.Context, mode TiDBChecksum, log *slog.Logger) error {
	for _, side := range p.tidbSides() {
		var storeErr error
		err := p.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			p.pushdown[side], storeErr = checksumPushdown(ctx, q, FlavorTiDB, mode)
			return nil
		})
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil: // no connection: as when the store cannot be read
			p.pushdown[side], storeErr = true, err
		}
		if storeErr != nil {
			log.Warn("cannot read the TiDB store type; assuming TiKV", "side", side.String(), "err", storeErr)
		}
		log.Info("tidb checksum form", "side", side.String(), "pushdown", p.pushdown[side], "tidb_checksum", string(mode))
	}
	return nil
}

// readCollations finds the TiDB sides that run without new collations
// (new_collations_enabled_on_first_bootstrap = false, the default of clusters bootstrapped
// before v6.0): they compare every string as its binary bytes, without padding, whatever
// collation a column declares. Asking the server to compare 'a' and 'A' under
// utf8mb4_general_ci needs no privilege (mysql.tidb's new_collation_enabled row does).
func (p *sourcePair) readCollations(ctx context.Context, log *slog.Logger) error {
	for _, side := range p.tidbSides() {
		var same int
		err := p.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			return queryRow(ctx, q, "SELECT _utf8mb4'a' = _utf8mb4'A' COLLATE utf8mb4_general_ci", &same)
		})
		if err != nil {
			return fmt.Errorf("%s: read the collation framework: %w", side, err)
		}
		p.binaryStrings[side] = same == 0
		if same == 0 {
			log.Warn("TiDB runs without new collations: it compares strings as binary bytes whatever their collation",
				"side", side.String())
		}
	}
	return nil
}

// readPacket reads both servers' max_allowed_packet (the session value, fixed when the
// session started) into p.packet.
func (p *sourcePair) readPacket(ctx context.Context) error {
	p.packet = 0
	for _, side := range []pairSide{upSide, downSide} {
		var n int64
		err := p.withSide(ctx, side, func(ctx context.Context, q Querier) error {
			return queryRow(ctx, q, "SELECT @@max_allowed_packet", &n)
		})
		if err != nil {
			return fmt.Errorf("%s: read max_allowed_packet: %w", side, err)
		}
		if p.packet == 0 || n < p.packet {
			p.packet = n
		}
	}
	return nil
}

// openDSNSources opens the sources of cfg's DSNs (each side read at its Snapshot when
// set, after checking that TiDB's GC still keeps it) and the meta database (cfg.MetaDSN,
// default the downstream DSN). closeAll closes them.
func openDSNSources(ctx context.Context, cfg *Config, log *slog.Logger) (src Sources, closeAll func(), err error) {
	if cfg.Upstream.DSN == "" || cfg.Downstream.DSN == "" {
		return Sources{}, nil, errors.New("invalid config: upstream.dsn and downstream.dsn are required")
	}
	if cfg.Upstream.TLS.On() || cfg.Downstream.TLS.On() {
		c := *cfg
		if err := c.ApplyTLS(); err != nil {
			return Sources{}, nil, err
		}
		cfg = &c
	}
	var closers []func() error
	closeOpened := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeOpened()
		}
	}()
	for _, s := range []struct {
		side pairSide
		sc   SourceConfig
		dst  *Source
	}{{upSide, cfg.Upstream, &src.Upstream}, {downSide, cfg.Downstream, &src.Downstream}} {
		if s.sc.Snapshot != "" {
			if err := checkSnapshotGC(ctx, s.sc.DSN, s.sc.Snapshot, time.Now(), log.With("side", s.side.String())); err != nil {
				return Sources{}, nil, fmt.Errorf("%s: %w", s.side, err)
			}
		}
		n := s.sc.Concurrency
		if n == 0 {
			n = cfg.Concurrency
		}
		ds, err := OpenDSN(ctx, s.sc.DSN, n, s.sc.Snapshot, cfg.QueryTimeout)
		if err != nil {
			return Sources{}, nil, fmt.Errorf("%s: %w", s.side, snapshotHint(err, cfg))
		}
		closers = append(closers, ds.Close)
		*s.dst = ds
	}
	metaDSN := cfg.MetaDSN
	if metaDSN == "" {
		metaDSN = cfg.Downstream.DSN
	}
	// The run state is written with a few short statements per chunk: interpolated
	// parameters make each one round trip instead of prepare, execute and close.
	mcfg, err := mysql.ParseDSN(metaDSN)
	if err != nil {
		return Sources{}, nil, fmt.Errorf("meta database: parse dsn: %w", err)
	}
	mcfg.InterpolateParams = true
	meta, err := sql.Open("mysql", mcfg.FormatDSN())
	if err != nil {
		return Sources{}, nil, fmt.Errorf("meta database: %w", err)
	}
	closers = append(closers, meta.Close)
	meta.SetMaxOpenConns(4)
	src.Meta = meta
	return src, closeOpened, nil
}

func queryRow(ctx context.Context, q Querier, query string, dest ...any) error {
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Err()
}

// firstRow returns the first row of query's n columns as values, or nil when it returns
// no row.
func firstRow(ctx context.Context, q Querier, query string, n int) ([]sqlValue, error) {
	rows, err := q.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	s := newRowStream(rows, n)
	if err := s.next(); err != nil || s.done {
		return nil, err
	}
	return s.row(), nil
}

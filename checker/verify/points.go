package verify

// points.go owns snapshot points: the fallback held exactly at an upstream TSO for as
// long as it takes to read its position there, recorded in the ts-map — a pair without
// its read views, for a runbook that wants the position.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/barrier"
	"github.com/tidb-parity/parity/internal/position"
	"github.com/tidb-parity/parity/internal/tso"
)

// Point is the fallback held exactly at an upstream TSO: a snapshot point.
type Point struct {
	TS uint64
	// Position is the fallback's position at TS as the ts-map and the history record it
	// ("mariadb-gtid:<gtid_binlog_pos>", "mysql-gtid:<gtid_executed>",
	// "binlog:<file>:<offset>"; "" without a binary log); Source names its kind
	// (PositionSource).
	Position, Source string
	// Pause is how long replication waited for the point (the applier's barrier).
	Pause     time.Duration
	CreatedAt time.Time
}

// PositionSource splits a position as Point.Position and PairRecord.Position hold it
// into the server's own value and its kind: gtid_binlog_pos (MariaDB), gtid_executed
// (MySQL) or binlog_pos (file:offset); "" for an empty position.
func PositionSource(pos string) (value, source string) {
	for _, p := range [][2]string{{"mariadb-gtid:", "gtid_binlog_pos"}, {"mysql-gtid:", "gtid_executed"}, {"binlog:", "binlog_pos"}} {
		if v, ok := strings.CutPrefix(pos, p[0]); ok {
			return v, p[1]
		}
	}
	return pos, ""
}

// tsMapSource is the ts-map's source of snapshot points.
const tsMapSource = "snapshot-point"

// SnapshotPoint holds the fallback exactly at atTS — 0: the applier's resolved ts
// (tried again at newer ones, then at TiDB's current TSO, when the applier passes it
// first, as a run's pairs are) — reads its position inside the barrier, records the
// point in the ts-map (source "snapshot-point") and returns it; the pause is counted in
// Stats().Pause. An atTS the applier has applied beyond fails with the applier's error
// (Deps.BarrierPassed); one TiDB's GC has passed with ErrPastGC. It waits while the
// changefeed has not resolved atTS yet.
func (s *Service) SnapshotPoint(ctx context.Context, atTS uint64) (Point, error) {
	if err := s.serving(); err != nil {
		return Point{}, err
	}
	log := s.log.With("component", "snapshot-point")
	if atTS != 0 {
		if err := checker.CheckSnapshotGC(ctx, s.cfg.UpstreamDSN, atTS, checkerQuiet(log)); err != nil {
			return Point{}, pastGC(fmt.Errorf("snapshot point at %d (%s): %w", atTS, tso.Format(atTS), err))
		}
	}
	var lastErr error
	for attempt := 1; attempt <= pairAttempts; attempt++ {
		ts := atTS
		if ts == 0 {
			var err error
			if attempt <= resolvedAttempts {
				ts, err = s.exec.pairTS(ctx)
			} else {
				ts, err = s.db.upstreamTSO(ctx, s.cfg.QueryTimeout)
			}
			if err != nil {
				return Point{}, err
			}
		}
		p, err := holdPoint(ctx, s.deps.Applier, s.db.kill, ts, s.cfg.QueryTimeout)
		if err == nil {
			if rt := s.deps.RecordTSMap; rt != nil {
				if err := rt(ctx, p.TS, p.Position, tsMapSource); err != nil {
					return Point{}, fmt.Errorf("snapshot point at %d: recording it in the ts-map: %w", ts, err)
				}
			}
			s.stats.pointHeld(p.Pause)
			log.Info("snapshot point", "resolved_ts", p.TS, "position", p.Position, "pause", p.Pause)
			return p, nil
		}
		lastErr = fmt.Errorf("snapshot point at %d: %w", ts, err)
		if atTS != 0 || ctx.Err() != nil || (s.deps.BarrierPassed != nil && !errors.Is(err, s.deps.BarrierPassed)) {
			return Point{}, lastErr
		}
		s.stats.barrierPassed()
	}
	return Point{}, fmt.Errorf("no snapshot point in %d attempts: %w", pairAttempts, lastErr)
}

// holdPoint holds the fallback at ts and reads its position there, on a connection
// taken before the barrier (so the pause is one query).
func holdPoint(ctx context.Context, a Applier, db *sql.DB, ts uint64, timeout time.Duration) (Point, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return Point{}, fmt.Errorf("downstream: %w", err)
	}
	defer conn.Close()
	p := Point{TS: ts}
	_, err = barrier.Hold(ctx, a.Barrier, ts, func(bctx context.Context) error {
		start := time.Now()
		defer func() { p.Pause = time.Since(start) }()
		qctx, cancel := context.WithTimeout(bctx, min(timeout, 30*time.Second))
		defer cancel()
		pos, err := position.Read(qctx, conn)
		p.Position, p.CreatedAt = pos, time.Now()
		return err
	})
	if err != nil {
		return Point{}, err
	}
	_, p.Source = PositionSource(p.Position)
	return p, nil
}

package checker

// gc.go owns what TiDB's GC means for a run that reads at a snapshot: the snapshot's
// time, the safe point and GC life it is checked against before anything reads
// (CheckSnapshotGC for callers that open a snapshot pair themselves, checkSnapshotGC for a
// run from DSNs), and the advice error 8055 is turned into. TSOs go through
// internal/tso. It must not open snapshot pairs (snapshot.go does).

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/tidb-parity/parity/internal/tso"
)

// TiDB keeps old row versions only until its GC safe point passes them: about
// now - tidb_gc_life_time (default 10 minutes), advanced every tidb_gc_run_interval. A
// diff that reads the upstream at a snapshot (tidb_snapshot) must start while the snapshot
// is readable and end before GC reaches it; TiDB refuses a collected snapshot with error
// 8055. parity has no PD connection to register a GC service safe point (as
// sync-diff-inspector does), so it checks the snapshot before the run, says until when it
// stays readable, and turns error 8055 into advice.

// CheckSnapshotGC refuses an upstream TSO that TiDB's GC has passed, before anything
// reads at it: the error names the TSO, its time and the GC safe point (mysql.tidb's
// tikv_gc_safe_point). It logs until about when GC keeps ts, and warns when that is
// soon. For callers that open a snapshot pair themselves (OpenSnapshotPair does not
// check); a run from DSNs checks its snapshots in the same way. A server that is not
// TiDB, or a safe point it may not read, is left to TiDB's own check (error 8055 when
// the snapshot is set). log may be nil (slog.Default()).
func CheckSnapshotGC(ctx context.Context, upstreamDSN string, ts uint64, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	return checkSnapshotGC(ctx, upstreamDSN, strconv.FormatUint(ts, 10), time.Now(), log)
}

// tidbSafePointLayout is how TiDB stores tikv_gc_safe_point in mysql.tidb.
const tidbSafePointLayout = "20060102-15:04:05.000 -0700"

// snapshotTime returns the physical time of a tidb_snapshot value: a TSO (tso.Time) or a
// datetime in UTC (the checker's sessions use time_zone +00:00).
func snapshotTime(snapshot string) (time.Time, bool) {
	if ts, err := strconv.ParseUint(snapshot, 10, 64); err == nil {
		return tso.Time(ts).UTC(), true
	}
	for _, layout := range []string{"2006-01-02 15:04:05.999999", "2006-01-02 15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, snapshot, time.UTC); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// checkSnapshotGC checks, on a session without tidb_snapshot, that snapshot is newer than
// TiDB's GC safe point, and logs until about when GC keeps it. A server that is not TiDB,
// a snapshot it cannot place in time, or a safe point it may not read (privileges) are
// left to TiDB's own check.
func checkSnapshotGC(ctx context.Context, dsn, snapshot string, now time.Time, log *slog.Logger) error {
	at, ok := snapshotTime(snapshot)
	if !ok {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	src, err := OpenDSN(qctx, dsn, 1, "", 30*time.Second)
	if err != nil {
		return err
	}
	defer src.Close()
	if src.Flavor() != FlavorTiDB {
		return nil
	}
	db := src.DB()
	var sp string
	err = db.QueryRowContext(qctx, "SELECT VARIABLE_VALUE FROM mysql.tidb WHERE VARIABLE_NAME = 'tikv_gc_safe_point'").Scan(&sp)
	if err != nil {
		log.Warn("cannot read TiDB's GC safe point; the snapshot is checked by TiDB only", "err", err)
		return nil
	}
	safe, err := time.Parse(tidbSafePointLayout, sp)
	if err != nil {
		log.Warn("cannot parse TiDB's GC safe point", "value", sp, "err", err)
		return nil
	}
	if at.Before(safe) {
		return fmt.Errorf("snapshot %s (%s) is older than TiDB's GC safe point (%s): its row versions may be gone; take a newer snapshot",
			snapshot, at.Format(time.RFC3339), safe.UTC().Format(time.RFC3339))
	}
	var life string
	if err := db.QueryRowContext(qctx, "SELECT @@global.tidb_gc_life_time").Scan(&life); err != nil {
		return nil
	}
	d, err := time.ParseDuration(life)
	if err != nil {
		return nil
	}
	if until, soon := gcDeadline(at, d, now); soon {
		log.Warn("TiDB's GC may collect the snapshot soon: a run that takes longer fails with error 8055; raise tidb_gc_life_time for it",
			"snapshot", snapshot, "readable_until", until.Format(time.RFC3339), "tidb_gc_life_time", life)
	} else {
		until := at.Add(d)
		log.Info("snapshot readable until about", "snapshot", snapshot, "readable_until", until.Format(time.RFC3339), "tidb_gc_life_time", life)
	}
	return nil
}

// gcDeadline returns until about when GC keeps a snapshot taken at at, given
// tidb_gc_life_time life, and whether that is less than 5 minutes after now.
func gcDeadline(at time.Time, life time.Duration, now time.Time) (time.Time, bool) {
	until := at.Add(life)
	return until, until.Sub(now) < 5*time.Minute
}

// snapshotHint explains TiDB's error 8055 (a snapshot older than the GC safe point) as
// tso.Hint does, and names the snapshots the run reads at; other errors are returned as
// they are.
func snapshotHint(err error, cfg *Config) error {
	if !tso.IsGCSafePoint(err) {
		return err
	}
	return fmt.Errorf("%w; this run reads the upstream at snapshot %q and the downstream at %q: start a new run at a newer snapshot",
		tso.Hint(err), cfg.Upstream.Snapshot, cfg.Downstream.Snapshot)
}

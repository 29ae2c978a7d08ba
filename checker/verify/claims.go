package verify

// claims.go owns what lets several daemons (active and standby) verify one changefeed on
// one fallback: the claims of schedule fires (verify_fires), by which each fire runs on
// one daemon, and the runs other daemons left running.
//
// A fire is claimed by inserting (changefeed, schedule, fire_at) — fire_at the cron
// schedule's own time, never the wall clock at insert, so daemons whose clocks differ by
// less than the schedule's period claim the same row. The insert that commits first
// wins; the others get a duplicate key and do nothing. The winner records exactly one
// row in verify_runs for the fire: the run, or a skipped firing when a run of the
// schedule still runs on a live daemon (this one or another). A daemon is alive while it
// holds its instance lock (instance.go). A run of a dead daemon left "running" is marked
// interrupted by the next claim of its schedule (or by any daemon's start).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
)

const (
	// fireRetention is how long claims are kept; each claim deletes at most
	// fireDeleteBatch older ones of its schedule.
	fireRetention   = 7 * 24 * time.Hour
	fireDeleteBatch = 100
)

// claim claims the fire at of schedule for this instance with run id runID; false when
// another daemon claimed it first. It deletes a bounded number of the schedule's
// claims older than fireRetention.
func (h *history) claim(ctx context.Context, schedule string, at time.Time, instance, runID string) (bool, error) {
	at = at.UTC().Truncate(time.Second)
	err := h.exec(ctx, "INSERT INTO %s."+FiresTable+" (changefeed, schedule, fire_at, instance, run_id) VALUES (?,?,?,?,?)",
		h.changefeed, schedule, at, instance, runID)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1062 { // duplicate key: claimed by another
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("claiming the %s fire of schedule %s: %w", at.Format(time.DateTime), schedule, err)
	}
	if err := h.exec(ctx, "DELETE FROM %s."+FiresTable+" WHERE changefeed=? AND schedule=? AND fire_at < ? LIMIT "+fmt.Sprint(fireDeleteBatch),
		h.changefeed, schedule, at.Add(-fireRetention)); err != nil {
		return true, fmt.Errorf("deleting old claims of schedule %s: %w", schedule, err)
	}
	return true, nil
}

// running returns the runs of trigger (all triggers when "") still recorded running,
// as run id → instance.
func (h *history) running(ctx context.Context, trigger string) (map[string]string, error) {
	qctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	q, args := "SELECT run_id, instance FROM %s."+RunsTable+" WHERE changefeed=? AND state=?", []any{h.changefeed, StateRunning}
	if trigger != "" {
		q, args = q+" AND trigger_name=?", append(args, trigger)
	}
	rows, err := h.db.QueryContext(qctx, h.q(q), args...)
	if err != nil {
		return nil, fmt.Errorf("reading the running verifications: %w", err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, inst string
		if err := rows.Scan(&id, &inst); err != nil {
			return nil, fmt.Errorf("reading the running verifications: %w", err)
		}
		out[id] = inst
	}
	return out, rows.Err()
}

// interrupt marks a run its stopped daemon left running as failed.
func (h *history) interrupt(ctx context.Context, runID, instance string) error {
	msg := "interrupted: the daemon stopped during the run"
	if instance != "" {
		msg = "interrupted: daemon " + instance + " stopped during the run"
	}
	err := h.exec(ctx, "UPDATE %s."+RunsTable+" SET state=?, result=?, error=?, finished_at=COALESCE(finished_at, CURRENT_TIMESTAMP(6)) WHERE run_id=? AND state=?",
		StateFailed, ResultFailed, msg, runID, StateRunning)
	if err != nil {
		return fmt.Errorf("verification history: %w", err)
	}
	return nil
}

// interrupted marks the runs left running by this instance before it started, and by
// instances that are not alive, as failed. Runs of other live daemons are theirs.
func (sc *scheduler) interrupted(ctx context.Context) error {
	runs, err := sc.hist.running(ctx, "")
	if err != nil {
		return err
	}
	for id, inst := range runs {
		alive := false
		if inst != sc.cfg.Instance {
			if alive, err = sc.lock.alive(ctx, sc.histDB, inst); err != nil {
				sc.log.Warn("cannot tell whether a verification left running is still running", "run_id", id, "instance", inst, "err", err)
			}
		}
		if alive {
			continue
		}
		if err := sc.hist.interrupt(ctx, id, inst); err != nil {
			return err
		}
		sc.log.Info("verification run left running by a stopped daemon marked interrupted", "run_id", id, "instance", inst)
	}
	return nil
}

// runningElsewhere returns a run of trigger still running on another live daemon (nil
// when none); the runs of stopped daemons it finds are marked interrupted.
func (sc *scheduler) runningElsewhere(ctx context.Context, trigger string) (*BusyError, error) {
	runs, err := sc.hist.running(ctx, trigger)
	if err != nil {
		return nil, err
	}
	for id, inst := range runs {
		if inst == sc.cfg.Instance {
			continue // this daemon's: its own busy check sees them
		}
		alive, err := sc.lock.alive(ctx, sc.histDB, inst)
		if err != nil {
			return nil, err
		}
		if alive {
			return &BusyError{Trigger: trigger, RunID: id, Instance: inst}, nil
		}
		if err := sc.hist.interrupt(ctx, id, inst); err != nil {
			return nil, err
		}
		sc.log.Info("verification run left running by a stopped daemon marked interrupted", "run_id", id, "instance", inst)
	}
	return nil, nil
}

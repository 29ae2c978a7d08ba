package verify

// fires.go owns what lets several daemons (active and standby) verify one changefeed on
// one fallback: the instance lock, by which a daemon shows the others it is alive, and
// the claims of schedule fires (verify_fires), by which each fire runs on one daemon.
//
// A fire is claimed by inserting (changefeed, schedule, fire_at) — fire_at the cron
// schedule's own time, never the wall clock at insert, so daemons whose clocks differ by
// less than the schedule's period claim the same row. The insert that commits first
// wins; the others get a duplicate key and do nothing. The winner records exactly one
// row in verify_runs for the fire: the run, or a skipped firing when a run of the
// schedule still runs on a live daemon (this one or another). A daemon is alive while it
// holds its instance lock: GET_LOCK on a connection of its own that pings the server
// every instanceKeepAlive with a session wait_timeout of instanceWaitTimeout, so the
// server drops the lock of a daemon whose process or host died within about a minute.
// A run of a dead daemon left "running" is marked interrupted by the next claim of its
// schedule (or by any daemon's start).

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

const (
	// instanceKeepAlive is how often the instance lock's connection is checked (and
	// the lock taken again when it was lost).
	instanceKeepAlive = 15 * time.Second
	// instanceWaitTimeout is the lock connection's wait_timeout: the server drops the
	// connection, and the lock with it, when a dead daemon stops pinging.
	instanceWaitTimeout = 60
	// fireRetention is how long claims are kept; each claim deletes at most
	// fireDeleteBatch older ones of its schedule.
	fireRetention   = 7 * 24 * time.Hour
	fireDeleteBatch = 100
)

// instanceLockName is the GET_LOCK name of an instance: per server, so it hashes the
// meta schema, the changefeed and the instance (names are at most 64 characters).
func instanceLockName(schema, changefeed, instance string) string {
	sum := sha256.Sum256([]byte(schema + "\x00" + changefeed + "\x00" + instance))
	return "parity_verify:" + hex.EncodeToString(sum[:20])
}

// instanceLock holds this daemon's instance lock and tells whether other instances
// hold theirs.
type instanceLock struct {
	db               *sql.DB // one connection: the lock's
	schema, cf, self string  // raw meta schema, changefeed, this instance
	timeout          time.Duration

	mu   sync.Mutex
	conn *sql.Conn
	warn string // the last problem taking the lock ("" while held)
}

// hold makes sure the lock is held, on a live connection; it returns why not.
func (l *instanceLock) hold(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	name := instanceLockName(l.schema, l.cf, l.self)
	qctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	if l.conn != nil {
		var mine sql.NullBool
		err := l.conn.QueryRowContext(qctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", name).Scan(&mine)
		if err == nil && mine.Valid && mine.Bool {
			return nil
		}
		_ = l.conn.Close()
		l.conn = nil
	}
	conn, err := l.db.Conn(qctx)
	if err != nil {
		return fmt.Errorf("taking the lock of verify.instance %q: %w", l.self, err)
	}
	if _, err := conn.ExecContext(qctx, fmt.Sprintf("SET SESSION wait_timeout = %d", instanceWaitTimeout)); err != nil {
		_ = conn.Close()
		return fmt.Errorf("taking the lock of verify.instance %q: %w", l.self, err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(qctx, "SELECT GET_LOCK(?, 0)", name).Scan(&got); err != nil {
		_ = conn.Close()
		return fmt.Errorf("taking the lock of verify.instance %q: %w", l.self, err)
	}
	if !got.Valid || got.Int64 != 1 {
		_ = conn.Close()
		return fmt.Errorf("verify.instance %q: its lock is held by another connection (another daemon with the same instance, or the connection of a stopped one the server has not dropped yet)", l.self)
	}
	l.conn = conn
	return nil
}

// alive reports whether instance holds its lock (this daemon is alive by definition).
// An error reading it counts as alive: a run is never started beside one that may
// still run.
func (l *instanceLock) alive(ctx context.Context, db *sql.DB, instance string) (bool, error) {
	if instance == l.self {
		return true, nil
	}
	qctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var holder sql.NullInt64
	if err := db.QueryRowContext(qctx, "SELECT IS_USED_LOCK(?)", instanceLockName(l.schema, l.cf, instance)).Scan(&holder); err != nil {
		return true, fmt.Errorf("reading whether verify instance %q is alive: %w", instance, err)
	}
	return holder.Valid, nil
}

func (l *instanceLock) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		_ = l.conn.Close()
		l.conn = nil
	}
}

// keepInstance holds the instance lock until ctx ends, taking it again when its
// connection was lost.
func (s *Service) keepInstance(ctx context.Context) error {
	for {
		if err := s.lock.hold(ctx); err != nil && ctx.Err() == nil {
			s.lock.mu.Lock()
			repeat := s.lock.warn == err.Error()
			s.lock.warn = err.Error()
			s.lock.mu.Unlock()
			if !repeat {
				s.log.Warn("verification instance lock not held: other daemons take this one's runs for stopped ones", "instance", s.cfg.Instance, "err", err)
			}
		} else {
			s.lock.mu.Lock()
			s.lock.warn = ""
			s.lock.mu.Unlock()
		}
		if sleep(ctx, instanceKeepAlive) != nil {
			return nil
		}
	}
}

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
func (s *Service) interrupted(ctx context.Context) error {
	runs, err := s.hist.running(ctx, "")
	if err != nil {
		return err
	}
	for id, inst := range runs {
		alive := false
		if inst != s.cfg.Instance {
			if alive, err = s.lock.alive(ctx, s.histDB, inst); err != nil {
				s.log.Warn("cannot tell whether a verification left running is still running", "run_id", id, "instance", inst, "err", err)
			}
		}
		if alive {
			continue
		}
		if err := s.hist.interrupt(ctx, id, inst); err != nil {
			return err
		}
		s.log.Info("verification run left running by a stopped daemon marked interrupted", "run_id", id, "instance", inst)
	}
	return nil
}

// runningElsewhere returns a run of trigger still running on another live daemon (nil
// when none); the runs of stopped daemons it finds are marked interrupted.
func (s *Service) runningElsewhere(ctx context.Context, trigger string) (*BusyError, error) {
	runs, err := s.hist.running(ctx, trigger)
	if err != nil {
		return nil, err
	}
	for id, inst := range runs {
		if inst == s.cfg.Instance {
			continue // this daemon's: its own busy check sees them
		}
		alive, err := s.lock.alive(ctx, s.histDB, inst)
		if err != nil {
			return nil, err
		}
		if alive {
			return &BusyError{Trigger: trigger, RunID: id, Instance: inst}, nil
		}
		if err := s.hist.interrupt(ctx, id, inst); err != nil {
			return nil, err
		}
		s.log.Info("verification run left running by a stopped daemon marked interrupted", "run_id", id, "instance", inst)
	}
	return nil, nil
}

package cdc

// ha.go runs the replicator as one of several daemons configured for the same changefeed
// and fallback (issue #20 item 7): exactly one of them, the one holding the lease in
// <meta-schema>.ha_lease, applies; the others wait as standbys.
//
// The lease is one row per changefeed: (holder, epoch, expires_at). Every time is the
// fallback's (UTC_TIMESTAMP(6)), never a daemon's clock. The active daemon renews it
// every ha.renew-interval with a conditional UPDATE (holder and epoch its own) that moves
// expires_at to now + 2/3 of ha.takeover. A standby reads it every 1/15 of ha.takeover
// and, once expires_at has passed (the active daemon died, its host went away, or it
// lost the fallback), takes it over in one transaction: the row locked, the epoch
// bumped, the holder and expiry replaced, the takeover recorded in ha_epochs. It then
// starts the replicator, which resumes exactly once from the meta schema as after a
// restart. From the last renewal to the new daemon applying takes at most
// 2/3 + 1/15 of ha.takeover plus the start (about a second), within ha.takeover.
//
// Fencing: a daemon that believes it is active may be wrong (paused, partitioned, its
// renewals failing). Every transaction the applier commits on the fallback — each row
// statement of a worker, a keyless table's unit, the round's checkpoint, a DDL's record,
// a repair's write, a ts-map row — reads the lease row first with a shared lock
// (LOCK IN SHARE MODE) and aborts unless the epoch is its own (ErrLeaseLost). A takeover
// takes the row's exclusive lock, so it waits for those transactions to commit, and
// every transaction after it reads the new epoch: a stale daemon's writes either commit
// before the takeover, or fail. A failed fence stops the replicator; the daemon becomes
// a standby again. DDL statements commit implicitly and cannot hold the lock: the lease
// is checked on the DDL's connection just before it runs (a daemon paused between that
// check and the DDL could still run it: the one window, documented in
// docs/reliability.md).
//
// Without ha.enabled nothing here runs and the applier writes as before (epoch 0: no
// fence).

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/tidb-parity/parity/internal/instance"
	"github.com/tidb-parity/parity/internal/metaschema"
)

// HAConfig configures standby operation ([ha]).
type HAConfig struct {
	// Enabled makes this daemon one of several configured for the same changefeed and
	// fallback: the one holding the lease in <meta-schema>.ha_lease applies, the others
	// wait as standbys (state "standby", gRPC health NOT_SERVING) and take over when it
	// stops renewing.
	// Default: false
	Enabled bool `toml:"enabled"`
	// Instance names this daemon in the lease (ha_lease.holder, ha_epochs, /status and
	// the parity_ha_* metrics). Unique per daemon. parity serve gives the daemon one
	// name: ha.instance, or verify.instance when only that is set.
	// Default: "" ("<hostname>:<pid>")
	Instance string `toml:"instance"`
	// Takeover bounds how long after the active daemon stops renewing its lease (killed,
	// its host gone, cut off from the fallback) a standby applies. The lease lasts 2/3 of
	// it; standbys read it every 1/15 of it. At least 3s.
	// Default: 15s
	Takeover time.Duration `toml:"takeover"`
	// RenewInterval is how often the active daemon renews its lease; at most 1/3 of
	// takeover (the lease survives a failed renewal).
	// Default: 0 (takeover / 5)
	RenewInterval time.Duration `toml:"renew-interval"`
}

// DefaultHAConfig returns the defaults documented on each field.
func DefaultHAConfig() HAConfig {
	return HAConfig{Takeover: 15 * time.Second}
}

func (c HAConfig) validate() []error {
	var errs []error
	bad := func(key, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, a...)))
	}
	if c.Takeover < 3*time.Second || c.Takeover > time.Hour {
		bad("ha.takeover", "must be between 3s and 1h, got %v", c.Takeover)
	}
	if c.RenewInterval < 0 || (c.RenewInterval > 0 && (c.RenewInterval < 100*time.Millisecond || c.RenewInterval > c.Takeover/3)) {
		bad("ha.renew-interval", "must be 0 (takeover / 5) or between 100ms and takeover / 3 (%v), got %v", c.Takeover/3, c.RenewInterval)
	}
	if len(c.Instance) > instance.MaxLen {
		bad("ha.instance", "longer than %d bytes", instance.MaxLen)
	}
	return errs
}

// ttl is how long a renewal keeps the lease.
func (c HAConfig) ttl() time.Duration { return c.Takeover * 2 / 3 }

// renew is how often the active daemon renews.
func (c HAConfig) renew() time.Duration {
	if c.RenewInterval > 0 {
		return c.RenewInterval
	}
	return c.Takeover / 5
}

// poll is how often a standby reads the lease.
func (c HAConfig) poll() time.Duration { return max(c.Takeover/15, 100*time.Millisecond) }

// waitTimeout is the session wait_timeout (whole seconds) of every connection of a
// daemon with ha: the fallback closes a connection idle for longer, rolling back its open
// transaction. A daemon paused (SIGSTOP, a VM frozen) or cut off inside a transaction
// holds the lease row's shared lock (its fence) and would block the takeover forever;
// its connection is closed a third of the lease after its last statement, before its
// lease can expire (two thirds of it at least after the pause: ttl - renew).
func (c HAConfig) waitTimeout() int {
	return max(1, int((c.ttl()/3+time.Second-1)/time.Second))
}

// session adds the ha session settings to params (a new map when nil) when enabled.
func (c HAConfig) session(params map[string]string) map[string]string {
	if !c.Enabled {
		return params
	}
	if params == nil {
		params = map[string]string{}
	}
	params["wait_timeout"] = strconv.Itoa(c.waitTimeout())
	return params
}

// pool makes db drop idle connections before the server's wait_timeout closes them.
func (c HAConfig) pool(db *sql.DB) {
	if c.Enabled {
		db.SetConnMaxIdleTime(time.Duration(c.waitTimeout()) * time.Second / 2)
	}
}

// ErrLeaseLost is returned (wrapped) by a write of a daemon that no longer holds the
// changefeed's lease: another daemon took over, or the lease expired unrenewed. The
// replicator stops applying and stands by.
var ErrLeaseLost = errors.New("lease lost")

// ErrStandby is returned by Barrier (and what depends on it: repair, snapshot pairs)
// on a standby daemon. It wraps ErrStopped.
var ErrStandby = fmt.Errorf("%w: this daemon is a standby (ha), the active daemon applies", ErrStopped)

// fencedError is a fence that failed: the lease is at another epoch.
type fencedError struct {
	mine, current uint64
	holder        string
}

func (e *fencedError) Error() string {
	if e.current == 0 {
		return fmt.Sprintf("%v: this daemon applies at epoch %d and the lease row is gone", ErrLeaseLost, e.mine)
	}
	return fmt.Sprintf("%v: this daemon applies at epoch %d, the lease is at epoch %d held by %s (another daemon took over)", ErrLeaseLost, e.mine, e.current, e.holder)
}

func (e *fencedError) Unwrap() error { return ErrLeaseLost }

// haMigration creates the lease tables and records each checkpoint's epoch.
var haMigration = metaschema.Step{Name: "ha_lease, ha_epochs and checkpoint.epoch: standby daemons", Stmts: []string{
	// One row per changefeed: who applies, at which epoch, until when (the fallback's
	// UTC clock).
	`CREATE TABLE IF NOT EXISTS %s.ha_lease (
		changefeed VARCHAR(128) NOT NULL PRIMARY KEY,
		holder VARCHAR(128) NOT NULL,
		epoch BIGINT UNSIGNED NOT NULL,
		acquired_at DATETIME(6) NOT NULL,
		renewed_at DATETIME(6) NOT NULL,
		expires_at DATETIME(6) NOT NULL
	) ENGINE=InnoDB`,
	// Every takeover: who took which epoch from whom, at which checkpoint.
	`CREATE TABLE IF NOT EXISTS %s.ha_epochs (
		changefeed VARCHAR(128) NOT NULL,
		epoch BIGINT UNSIGNED NOT NULL,
		holder VARCHAR(128) NOT NULL,
		previous_holder VARCHAR(128) NOT NULL,
		acquired_at DATETIME(6) NOT NULL,
		applied_ts BIGINT UNSIGNED NOT NULL,
		PRIMARY KEY (changefeed, epoch)
	) ENGINE=InnoDB`,
	// The epoch of the daemon that wrote the checkpoint (0 without ha): in the binlog,
	// the checkpoint's row images show which epoch applied each round.
	`ALTER TABLE %s.checkpoint ADD COLUMN epoch BIGINT UNSIGNED NOT NULL DEFAULT 0`,
}}

// fenceSQL reads the lease's epoch under a shared lock: a takeover (exclusive) waits for
// the transaction, and the transaction reads the epoch a takeover committed.
const fenceSQL = "SELECT epoch, holder FROM %s.ha_lease WHERE changefeed=? LOCK IN SHARE MODE"

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// fence checks, inside the caller's transaction (or on the DDL's connection), that
// this daemon still holds the lease at its epoch. Without ha (epoch 0) it does nothing.
func (m *meta) fence(ctx context.Context, q queryRower) error {
	if m.epoch == 0 {
		return nil
	}
	var cur uint64
	var holder string
	err := q.QueryRowContext(ctx, m.q(fenceSQL), m.changefeed).Scan(&cur, &holder)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return &fencedError{mine: m.epoch}
	case err != nil:
		return fmt.Errorf("checking the lease: %w", err)
	case cur != m.epoch:
		return &fencedError{mine: m.epoch, current: cur, holder: holder}
	}
	return nil
}

// execFenced runs one write statement on db: in a transaction that checks the lease
// first when the daemon holds one (ha), as a plain statement otherwise.
func (m *meta) execFenced(ctx context.Context, db *sql.DB, q string, args ...any) error {
	if m.epoch == 0 {
		_, err := db.ExecContext(ctx, q, args...)
		return err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	if err := m.fence(ctx, tx); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return err
	}
	return tx.Commit()
}

// lease is this daemon's side of the changefeed's lease.
type lease struct {
	db       *sql.DB
	m        *meta
	cfg      HAConfig
	instance string
	log      *slog.Logger
}

// leaseView is the lease as a standby last read it.
type leaseView struct {
	holder    string
	epoch     uint64
	expiresIn time.Duration // negative: expired
}

// tryAcquire takes the lease when nobody holds it or it expired: it returns the new
// epoch. Otherwise it returns 0 and the lease as it is.
func (l *lease) tryAcquire(ctx context.Context) (epoch uint64, view leaseView, err error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.poll()*5)
	defer cancel()
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, view, err
	}
	defer tx.Rollback() //nolint:errcheck // no-op after commit
	var expiresUs int64
	err = tx.QueryRowContext(ctx, l.m.q(`SELECT holder, epoch, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)
		FROM %s.ha_lease WHERE changefeed=? FOR UPDATE`), l.m.changefeed).Scan(&view.holder, &view.epoch, &expiresUs)
	found := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, view, fmt.Errorf("reading the lease: %w", err)
	}
	view.expiresIn = time.Duration(expiresUs) * time.Microsecond
	if found && view.expiresIn >= 0 {
		// Held, also when by this daemon's own name (a restart under a fixed
		// ha.instance waits as any standby: two daemons misconfigured with one name
		// must not take it from each other at every read).
		return 0, view, nil
	}
	var applied uint64
	if err := tx.QueryRowContext(ctx, l.m.q("SELECT COALESCE(MAX(applied_ts), 0) FROM %s.checkpoint WHERE changefeed=?"), l.m.changefeed).Scan(&applied); err != nil {
		return 0, view, fmt.Errorf("reading the checkpoint: %w", err)
	}
	epoch = view.epoch + 1
	ttl := l.cfg.ttl().Microseconds()
	if found {
		_, err = tx.ExecContext(ctx, l.m.q(`UPDATE %s.ha_lease SET holder=?, epoch=?, acquired_at=UTC_TIMESTAMP(6),
			renewed_at=UTC_TIMESTAMP(6), expires_at=UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE changefeed=?`),
			l.instance, epoch, ttl, l.m.changefeed)
	} else {
		// A concurrent first insert fails with a duplicate key: this daemon stays a
		// standby and reads the winner's row next time.
		_, err = tx.ExecContext(ctx, l.m.q(`INSERT INTO %s.ha_lease (changefeed, holder, epoch, acquired_at, renewed_at, expires_at)
			VALUES (?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)`),
			l.m.changefeed, l.instance, epoch, ttl)
	}
	if err != nil {
		return 0, view, fmt.Errorf("taking the lease: %w", err)
	}
	if _, err := tx.ExecContext(ctx, l.m.q(`INSERT INTO %s.ha_epochs (changefeed, epoch, holder, previous_holder, acquired_at, applied_ts)
		VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6), ?)`), l.m.changefeed, epoch, l.instance, view.holder, applied); err != nil {
		return 0, view, fmt.Errorf("recording the takeover: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, view, fmt.Errorf("taking the lease: %w", err)
	}
	return epoch, view, nil
}

// renew extends the lease held at epoch; a lease another daemon took is ErrLeaseLost.
func (l *lease) renew(ctx context.Context, epoch uint64) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.renew())
	defer cancel()
	res, err := l.db.ExecContext(ctx, l.m.q(`UPDATE %s.ha_lease SET renewed_at=UTC_TIMESTAMP(6),
		expires_at=UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE changefeed=? AND holder=? AND epoch=?`),
		l.cfg.ttl().Microseconds(), l.m.changefeed, l.instance, epoch)
	if err != nil {
		return fmt.Errorf("renewing the lease: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	var cur uint64
	var holder string
	err = l.db.QueryRowContext(ctx, l.m.q("SELECT epoch, holder FROM %s.ha_lease WHERE changefeed=?"), l.m.changefeed).Scan(&cur, &holder)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("renewing the lease: %w", err)
	}
	if cur == epoch && holder == l.instance {
		return nil // renewed within the same microsecond: nothing changed
	}
	return &fencedError{mine: epoch, current: cur, holder: holder}
}

// release ends the lease held at epoch at once, so a standby takes over without
// waiting for it to expire (a clean stop).
func (l *lease) release(ctx context.Context, epoch uint64) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.renew())
	defer cancel()
	_, err := l.db.ExecContext(ctx, l.m.q("UPDATE %s.ha_lease SET expires_at=UTC_TIMESTAMP(6) WHERE changefeed=? AND holder=? AND epoch=?"),
		l.m.changefeed, l.instance, epoch)
	return err
}

// keep renews the lease held at epoch every renew interval until ctx ends (nil), the
// lease is taken by another daemon, or no renewal succeeded for the lease's duration
// (both ErrLeaseLost: by then a standby may have taken it).
func (l *lease) keep(ctx context.Context, epoch uint64, lastOK time.Time, onRenew func()) error {
	ttl := l.cfg.ttl()
	t := time.NewTimer(l.cfg.renew())
	defer t.Stop()
	// The lease may have expired once ttl passed since the last renewal that succeeded
	// was sent (the fallback's expiry is later): stop then, whatever a renewal in flight
	// is doing.
	deadline := time.NewTimer(ttl - time.Since(lastOK))
	defer deadline.Stop()
	var lastErr error
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-deadline.C:
			return fmt.Errorf("%w: not renewed for %v (ha.takeover %v): %v", ErrLeaseLost, time.Since(lastOK).Round(time.Millisecond), l.cfg.Takeover, lastErr)
		case <-t.C:
		}
		sent := time.Now()
		rctx, cancel := context.WithDeadline(ctx, lastOK.Add(ttl))
		err := l.renew(rctx, epoch)
		cancel()
		switch {
		case err == nil:
			lastOK = sent
			deadline.Reset(ttl - time.Since(sent))
			onRenew()
			t.Reset(l.cfg.renew())
			continue
		case errors.Is(err, ErrLeaseLost):
			return err
		case ctx.Err() != nil:
			return nil
		}
		lastErr = err
		l.log.Warn("could not renew the lease, retrying", "epoch", epoch, "err", err)
		t.Reset(l.cfg.renew() / 3)
	}
}

// roundContext is the context of an apply round: a started round finishes when ctx
// ends (SIGTERM drains), unless ctx ended because the lease was lost: the round's writes
// would all fail their fence, and its retries (the fallback out of reach) must not keep
// the daemon from standing by.
func roundContext(ctx context.Context) (context.Context, context.CancelFunc) {
	rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() {
		if cause := context.Cause(ctx); errors.Is(cause, ErrLeaseLost) {
			cancel(cause)
		}
	})
	return rctx, func() { stop(); cancel(nil) }
}

// HAStatus is the standby state of a daemon with ha.enabled.
type HAStatus struct {
	Instance string `json:"instance"`
	// Role is "active" (holds the lease and applies) or "standby".
	Role string `json:"role"`
	// Epoch is the lease's epoch: this daemon's while active, the holder's as last read
	// while standing by.
	Epoch uint64 `json:"epoch"`
	// Holder is the instance holding the lease ("" when none does).
	Holder string `json:"holder"`
	// LeaseExpiresInSeconds is, as last read or renewed, how long the lease lasts
	// (negative: expired).
	LeaseExpiresInSeconds float64 `json:"lease_expires_in_seconds"`
	// Takeovers counts the leases this daemon acquired since start.
	Takeovers int64 `json:"takeovers"`
	// ActiveSince is when this daemon last took the lease (zero while it never did).
	ActiveSince time.Time `json:"active_since,omitempty"`
	// LostReason is why this daemon last stopped applying while it ran (another daemon
	// took the lease, a fence failed, renewals failed): "" while it never lost one.
	LostReason string `json:"lost_reason,omitempty"`
}

// haState is the replicator's HAStatus, updated by runHA.
type haState struct {
	mu sync.Mutex
	st HAStatus
	// changed is closed (and dropped) when st.Role changes; watch makes it.
	changed chan struct{}
}

func (h *haState) update(f func(*HAStatus)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	role := h.st.Role
	f(&h.st)
	if h.st.Role != role && h.changed != nil {
		close(h.changed)
		h.changed = nil
	}
}

// watch returns the role and a channel closed when it changes.
func (h *haState) watch() (HAStatus, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.changed == nil {
		h.changed = make(chan struct{})
	}
	return h.st, h.changed
}

// WhileActive runs fn while this daemon is the one that applies: without ha.enabled
// once, for as long as ctx lasts; with it, each time the daemon takes the changefeed's
// lease, with a context that ends when the daemon stands by again (the lease lost) or
// Run returns. A standby never runs fn. It returns when ctx ends (with fn's error, if
// fn was running), or with fn's error when fn returns by itself while the daemon is
// active. what names fn in the log lines that say when it waits, starts and stops.
//
// It is for what only one daemon of a changefeed may do at a time, beside the applier:
// the bypass detector's binlog client registers with one server id, and two daemons
// reading with the same id disconnect each other (ERROR 4052).
func (r *Replicator) WhileActive(ctx context.Context, what string, fn func(context.Context) error) error {
	if !r.cfg.HA.Enabled {
		return fn(ctx)
	}
	waiting := false
	for {
		select {
		case <-r.done:
			return nil // Run returned: the lease is released or lost
		default:
		}
		st, changed := r.ha.watch()
		if st.Role != "active" {
			if st.Role == "standby" && !waiting {
				waiting = true
				r.log.Info(what+" waits: this daemon is a standby (ha), the active daemon runs it", "instance", r.instance)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-r.done:
				return nil
			case <-changed:
				continue
			}
		}
		waiting = false
		r.log.Info(what+" starts: this daemon holds the lease", "instance", r.instance, "epoch", st.Epoch)
		actx, cancel := context.WithCancel(ctx)
		var (
			wg   sync.WaitGroup
			lost bool
		)
		stop := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-changed:
			case <-r.done:
			case <-stop:
				return
			}
			lost = true
			cancel()
		}()
		err := fn(actx)
		close(stop)
		wg.Wait()
		cancel()
		if ctx.Err() != nil || !lost {
			return err
		}
		if err != nil {
			r.log.Warn(what+" stopped with an error as this daemon stood by", "instance", r.instance, "epoch", st.Epoch, "err", err)
		} else {
			r.log.Info(what+" stopped: this daemon no longer holds the lease", "instance", r.instance, "epoch", st.Epoch)
		}
	}
}

func (h *haState) get() HAStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st
}

// runHA is Run with ha.enabled: stand by until the lease is this daemon's, apply while
// it is, stand by again when it is lost; release it when ctx ends.
func (r *Replicator) runHA(ctx context.Context, started func()) error {
	cfg := r.cfg
	db, err := openDB("downstream", cfg.Downstream.DSN, cfg.HA.session(nil), 2)
	if err != nil {
		return err
	}
	defer db.Close()
	cfg.HA.pool(db)
	m := newMeta(db, cfg.Applier.MetaSchema, cfg.Changefeed.ID, cfg.Applier.QueryTimeout)
	if err := m.migrate(ctx); err != nil {
		return err
	}
	l := &lease{db: db, m: m, cfg: cfg.HA, instance: r.instance, log: r.log}
	r.ha.update(func(s *HAStatus) { s.Instance, s.Role = r.instance, "standby" })
	for {
		epoch, sent, err := r.standBy(ctx, l)
		if err != nil || epoch == 0 {
			return err // ctx ended
		}
		err = r.runActive(ctx, l, epoch, sent, started)
		if ctx.Err() != nil || !errors.Is(err, ErrLeaseLost) {
			if rerr := l.release(ctx, epoch); rerr != nil {
				r.log.Warn("could not release the lease (a standby takes over when it expires)", "epoch", epoch, "err", rerr)
			} else {
				r.log.Info("lease released", "epoch", epoch)
			}
			return err
		}
		r.log.Warn("lost the lease; standing by", "epoch", epoch, "err", err)
		r.ha.update(func(s *HAStatus) { s.LostReason = err.Error() })
	}
}

// standBy reads the lease every poll interval until this daemon takes it (its epoch) or
// ctx ends (0). Errors reading the lease (the fallback unreachable) are logged and
// retried: a standby waits as long as it is asked to.
func (r *Replicator) standBy(ctx context.Context, l *lease) (epoch uint64, sent time.Time, err error) {
	r.standby.Store(true)
	r.ha.update(func(s *HAStatus) { s.Role = "standby" })
	r.mu.Lock()
	r.status.State, r.status.Error = "standby", ""
	r.status.UpdatedAt = time.Now()
	r.mu.Unlock()
	var lastErr time.Time
	logged := ""
	for {
		sent = time.Now()
		var view leaseView
		epoch, view, err = l.tryAcquire(ctx)
		switch {
		case err == nil && epoch > 0:
			r.log.Info("took over the lease", "epoch", epoch, "previous_holder", view.holder, "instance", r.instance)
			now := time.Now()
			r.ha.update(func(s *HAStatus) {
				s.Role, s.Epoch, s.Holder, s.Takeovers, s.ActiveSince = "active", epoch, r.instance, s.Takeovers+1, now
				s.LeaseExpiresInSeconds = l.cfg.ttl().Seconds()
			})
			r.standby.Store(false)
			return epoch, sent, nil
		case err != nil:
			if ctx.Err() != nil {
				return 0, sent, nil
			}
			if time.Since(lastErr) >= 30*time.Second {
				lastErr = time.Now()
				r.log.Warn("standby could not read the lease, retrying", "err", err)
			}
		default:
			r.ha.update(func(s *HAStatus) {
				s.Role, s.Epoch, s.Holder, s.LeaseExpiresInSeconds = "standby", view.epoch, view.holder, view.expiresIn.Seconds()
			})
			if logged != view.holder {
				logged = view.holder
				r.log.Info("standing by", "holder", view.holder, "epoch", view.epoch, "instance", r.instance)
			}
			// The standby's status shows the checkpoint the active daemon applied.
			cctx, cancel := context.WithTimeout(ctx, l.cfg.poll()*5)
			ts, ok, err := l.m.checkpoint(cctx)
			cancel()
			if err == nil && ok {
				r.advance(ts)
			}
		}
		select {
		case <-ctx.Done():
			return 0, sent, nil
		case <-time.After(l.cfg.poll()):
		}
	}
}

// runActive applies while the lease at epoch is this daemon's: the replicator fenced at
// epoch, the lease renewed beside it. A lost lease cancels the replicator's context with
// an ErrLeaseLost cause, which also ends the round in progress (see roundContext). It returns when ctx ends (nil), the replicator
// fails, or the lease is lost (ErrLeaseLost, from the renewals or a fence).
func (r *Replicator) runActive(ctx context.Context, l *lease, epoch uint64, acquired time.Time, started func()) error {
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var keepErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		keepErr = l.keep(actx, epoch, acquired, func() {
			r.ha.update(func(s *HAStatus) { s.LeaseExpiresInSeconds = l.cfg.ttl().Seconds() })
		})
		if keepErr != nil {
			cancel(keepErr) // the replicator finishes its round (fenced) and stops
		}
	}()
	err := r.runEpoch(actx, epoch, started)
	cancel(nil)
	wg.Wait()
	switch {
	case keepErr == nil:
		return err
	case err == nil || errors.Is(err, ErrLeaseLost):
		return keepErr
	default:
		// The lease is gone; what stopped the round (typically the fallback out of
		// reach, as for the renewals) does not stop the daemon: it stands by.
		return fmt.Errorf("%w (the applier stopped with: %v)", keepErr, err)
	}
}

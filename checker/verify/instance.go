package verify

// instance.go owns the instance lock, by which a daemon verifying a changefeed shows the
// others it is alive: GET_LOCK on a connection of its own that pings the server every
// instanceKeepAlive with a session wait_timeout of instanceWaitTimeout, so the server
// drops the lock of a daemon whose process or host died within about a minute. The
// scheduler asks it whether the daemon a run is recorded on still lives (claims.go).

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tidb-parity/parity/internal/retry"
)

const (
	// instanceKeepAlive is how often the instance lock's connection is checked (and
	// the lock taken again when it was lost).
	instanceKeepAlive = 15 * time.Second
	// instanceWaitTimeout is the lock connection's wait_timeout: the server drops the
	// connection, and the lock with it, when a dead daemon stops pinging.
	instanceWaitTimeout = 60
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

// keep holds the instance lock until ctx ends, taking it again when its connection
// was lost.
func (l *instanceLock) keep(ctx context.Context, log *slog.Logger) error {
	for {
		if err := l.hold(ctx); err != nil && ctx.Err() == nil {
			l.mu.Lock()
			repeat := l.warn == err.Error()
			l.warn = err.Error()
			l.mu.Unlock()
			if !repeat {
				log.Warn("verification instance lock not held: other daemons take this one's runs for stopped ones", "instance", l.self, "err", err)
			}
		} else {
			l.mu.Lock()
			l.warn = ""
			l.mu.Unlock()
		}
		if retry.Sleep(ctx, instanceKeepAlive) != nil {
			return nil
		}
	}
}

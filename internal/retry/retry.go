// Package retry is parity's one retry policy: which database errors are worth another
// attempt, and how attempts are spaced and bounded. The applier, the upstream row fetch,
// the load generator and the checker all talk to MySQL/MariaDB/TiDB through
// go-sql-driver/mysql and must agree on what "transient" means; a leaf package keeps them
// from importing each other for it.
package retry

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Kind says why an error happened, for deciding what to do about it.
type Kind uint8

const (
	// Permanent errors fail the same way again: syntax, a missing table, a rejected
	// value, a privilege. Never retried.
	Permanent Kind = iota
	// Conflict: the server rolled the statement or transaction back because of
	// another transaction (deadlock, lock wait timeout, TiDB's write conflict). Running
	// it again is safe and usually succeeds.
	Conflict
	// Connection: the connection or the server went away, or the attempt's own timeout
	// fired. The statement's outcome may be unknown.
	Connection
	// Unavailable: TiDB could not reach TiKV or PD (errors 9001-9007 except 9007,
	// which is a write conflict).
	Unavailable
)

func (k Kind) String() string {
	switch k {
	case Conflict:
		return "conflict"
	case Connection:
		return "connection"
	case Unavailable:
		return "unavailable"
	}
	return "permanent"
}

// Classify returns the kind of err.
func Classify(err error) Kind {
	if err == nil {
		return Permanent
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case 1205, // lock wait timeout
			1213, // deadlock
			9007, // TiDB: write conflict
			8022, // TiDB: transaction retry error
			8028, // TiDB: schema changed during the transaction
			8002: // TiDB: SELECT FOR UPDATE cannot be retried
			return Conflict
		case 1105:
			if strings.Contains(me.Message, "pessimistic lock retry limit reached") {
				return Conflict
			}
			return Permanent
		case 1040, // too many connections
			1053,       // server shutdown in progress
			1159, 1161, // network read/write timeout
			1927,       // MariaDB: connection was killed
			2006, 2013: // gone away, lost connection
			return Connection
		case 9001, 9002, 9003, 9004, 9005, 9006: // PD / TiKV / region unavailable, server busy
			return Unavailable
		}
		return Permanent
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return Connection
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return Connection
	}
	return Permanent
}

// Transient reports whether err is worth another attempt.
func Transient(err error) bool { return Classify(err) != Permanent }

// Policy bounds and spaces attempts.
type Policy struct {
	// MaxRetries is how many attempts follow the first. Default: 10.
	MaxRetries int
	// Backoff is the wait before the first retry; it doubles up to MaxBackoff.
	// Default: 100ms.
	Backoff time.Duration
	// MaxBackoff caps the wait between attempts. Default: 5s.
	MaxBackoff time.Duration
	// Timeout bounds each attempt (a context derived from the caller's). Default: 0
	// (none beyond the caller's).
	Timeout time.Duration
	// Retryable decides which errors are retried. Default: Transient.
	Retryable func(error) bool
}

// Do runs f until it succeeds, returns an error Retryable rejects, or MaxRetries retries
// failed; each attempt gets its own timeout. onRetry, when not nil, is told of each retry
// before its wait (for a log line). The error returned is the last attempt's, or ctx's
// when ctx ended.
func (p Policy) Do(ctx context.Context, f func(context.Context) error, onRetry func(attempt int, wait time.Duration, err error)) error {
	backoff := p.Backoff
	if backoff <= 0 {
		backoff = 100 * time.Millisecond
	}
	maxBackoff := p.MaxBackoff
	if maxBackoff <= 0 {
		maxBackoff = 5 * time.Second
	}
	retryable := p.Retryable
	if retryable == nil {
		retryable = Transient
	}
	for attempt := 0; ; attempt++ {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if p.Timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, p.Timeout)
		}
		err := f(actx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !retryable(err) || attempt >= p.MaxRetries {
			return err
		}
		if onRetry != nil {
			onRetry(attempt+1, backoff, err)
		}
		if err := Sleep(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// Sleep waits d, or until ctx ends (then its error). d <= 0 does not wait: the error is
// ctx's, nil while it lasts. The one wait of the module's loops (retries, throttles,
// polls).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

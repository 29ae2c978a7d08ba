package retry

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

func TestClassify(t *testing.T) {
	my := func(n uint16, msg string) error {
		return fmt.Errorf("exec: %w", &mysql.MySQLError{Number: n, Message: msg})
	}
	for _, tc := range []struct {
		err  error
		want Kind
	}{
		{nil, Permanent},
		{errors.New("syntax"), Permanent},
		{my(1064, "You have an error in your SQL syntax"), Permanent},
		{my(1146, "Table 'a.b' doesn't exist"), Permanent},
		{my(1213, "Deadlock found"), Conflict},
		{my(1205, "Lock wait timeout exceeded"), Conflict},
		{my(9007, "Write conflict"), Conflict},
		{my(8028, "Information schema is changed"), Conflict},
		{my(1105, "pessimistic lock retry limit reached"), Conflict},
		{my(1105, "unknown error"), Permanent},
		{my(2013, "Lost connection"), Connection},
		{my(1927, "Connection was killed"), Connection},
		{my(9001, "PD server timeout"), Unavailable},
		{my(9005, "Region is unavailable"), Unavailable},
		{fmt.Errorf("q: %w", driver.ErrBadConn), Connection},
		{mysql.ErrInvalidConn, Connection},
		{io.ErrUnexpectedEOF, Connection},
		{context.DeadlineExceeded, Connection},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), Connection},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestDo(t *testing.T) {
	p := Policy{MaxRetries: 3, Backoff: time.Millisecond, Timeout: time.Second}
	ctx := context.Background()
	transient := &mysql.MySQLError{Number: 1213}
	t.Run("succeeds after transient errors", func(t *testing.T) {
		n, retries := 0, 0
		err := p.Do(ctx, func(ctx context.Context) error {
			if _, ok := ctx.Deadline(); !ok {
				t.Error("an attempt without its own timeout")
			}
			n++
			if n < 3 {
				return transient
			}
			return nil
		}, func(int, time.Duration, error) { retries++ })
		if err != nil || n != 3 || retries != 2 {
			t.Fatalf("err %v after %d attempts, %d retries", err, n, retries)
		}
	})
	t.Run("gives up after MaxRetries", func(t *testing.T) {
		n := 0
		err := p.Do(ctx, func(context.Context) error { n++; return transient }, nil)
		if !errors.Is(err, transient) || n != 4 {
			t.Fatalf("err %v after %d attempts, want the last error after 4", err, n)
		}
	})
	t.Run("never retries a permanent error", func(t *testing.T) {
		n := 0
		perm := &mysql.MySQLError{Number: 1146}
		err := p.Do(ctx, func(context.Context) error { n++; return perm }, nil)
		if !errors.Is(err, perm) || n != 1 {
			t.Fatalf("err %v after %d attempts", err, n)
		}
	})
	t.Run("stops when the caller's context ends", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		slow := Policy{MaxRetries: 100, Backoff: time.Hour}
		go func() { time.Sleep(20 * time.Millisecond); cancel() }()
		err := slow.Do(cctx, func(context.Context) error { return transient }, nil)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err %v, want context.Canceled", err)
		}
	})
	t.Run("backoff doubles up to the cap", func(t *testing.T) {
		var waits []time.Duration
		q := Policy{MaxRetries: 5, Backoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond}
		_ = q.Do(ctx, func(context.Context) error { return transient }, func(_ int, w time.Duration, _ error) { waits = append(waits, w) })
		want := []time.Duration{1, 2, 4, 4, 4}
		for i := range want {
			if waits[i] != want[i]*time.Millisecond {
				t.Fatalf("waits %v, want %v ms", waits, want)
			}
		}
	})
}

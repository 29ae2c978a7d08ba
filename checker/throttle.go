package checker

import (
	"context"
	"database/sql"
	"sync"
	"time"
)

// rateLimiter paces workers to at most rate rows per second overall.
type rateLimiter struct {
	rate float64
	mu   sync.Mutex
	next time.Time
}

func newRateLimiter(rowsPerSecond int) *rateLimiter {
	return &rateLimiter{rate: float64(rowsPerSecond)}
}

// take accounts for rows just read and sleeps as long as needed to stay under the rate.
func (l *rateLimiter) take(ctx context.Context, rows int) error {
	if l.rate <= 0 || rows <= 0 {
		return nil
	}
	l.mu.Lock()
	now := time.Now()
	if l.next.Before(now) {
		l.next = now
	}
	l.next = l.next.Add(time.Duration(float64(rows) / l.rate * float64(time.Second)))
	wait := l.next.Sub(now)
	l.mu.Unlock()
	return sleep(ctx, wait)
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
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

// busyGate holds new chunks back while the downstream's Threads_running is above limit.
type busyGate struct {
	r     *runner
	limit int

	mu      sync.Mutex
	checked time.Time
	busy    bool
}

func (g *busyGate) wait(ctx context.Context) error {
	if g.limit <= 0 {
		return nil
	}
	for {
		busy, err := g.isBusy(ctx)
		if err != nil {
			return err
		}
		if !busy {
			return nil
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

func (g *busyGate) isBusy(ctx context.Context) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if time.Since(g.checked) < time.Second {
		return g.busy, nil
	}
	var name string
	var n int
	err := g.r.withSide(ctx, Downstream, func(ctx context.Context, q Querier) error {
		rows, err := q.QueryContext(ctx, "SHOW GLOBAL STATUS LIKE 'Threads_running'")
		if err != nil {
			return err
		}
		defer rows.Close()
		if rows.Next() {
			if err := rows.Scan(&name, &n); err != nil {
				return err
			}
		}
		return rows.Err()
	})
	if err != nil {
		return false, err
	}
	g.checked = time.Now()
	// Our own connections count too: allow for them.
	g.busy = n-g.r.cfg.Concurrency > g.limit
	if g.busy {
		g.r.log.Info("downstream busy; pausing", "threads_running", n, "limit", g.limit)
	}
	return g.busy, nil
}

var _ = sql.ErrNoRows

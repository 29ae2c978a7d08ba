package checker

import (
	"context"
	"fmt"
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

// busyGate holds new chunks back while the downstream's Threads_running (minus the
// checker's own connections) is above limit, or while the changefeed replicating into
// the downstream lags by more than maxLag.
type busyGate struct {
	limit  int
	own    int                                              // the checker's own concurrent queries
	probe  func(ctx context.Context) (int, error)           // reads Threads_running
	maxLag time.Duration                                    // 0: lag not checked
	lag    func(ctx context.Context) (time.Duration, error) // reads the changefeed's lag
	every  time.Duration                                    // re-probe interval
	log    func(threads int)
	logLag func(lag time.Duration)

	mu      sync.Mutex
	checked time.Time
	busy    bool
}

func newBusyGate(r *runner) *busyGate {
	return &busyGate{
		limit:  r.cfg.MaxThreadsRunning,
		own:    r.cfg.Concurrency,
		maxLag: r.cfg.Changefeed.MaxLag,
		lag:    r.cfg.Lag,
		every:  time.Second,
		probe: func(ctx context.Context) (int, error) {
			var name string
			var n int
			err := r.withSide(ctx, Downstream, func(ctx context.Context, q Querier) error {
				return queryRow(ctx, q, "SHOW GLOBAL STATUS LIKE 'Threads_running'", &name, &n)
			})
			return n, err
		},
		log: func(n int) {
			r.log.Info("downstream busy; pausing", "threads_running", n, "limit", r.cfg.MaxThreadsRunning)
		},
		logLag: func(lag time.Duration) {
			r.log.Info("changefeed lagging; pausing", "changefeed", r.cfg.Changefeed.ID, "lag", lag.Round(time.Millisecond), "max_lag", r.cfg.Changefeed.MaxLag)
		},
	}
}

func (g *busyGate) wait(ctx context.Context) error {
	if g.limit <= 0 && g.maxLag <= 0 {
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
		if err := sleep(ctx, g.every); err != nil {
			return err
		}
	}
}

func (g *busyGate) isBusy(ctx context.Context) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.checked.IsZero() && time.Since(g.checked) < g.every {
		return g.busy, nil
	}
	busy := false
	if g.limit > 0 {
		n, err := g.probe(ctx)
		if err != nil {
			return false, fmt.Errorf("read downstream Threads_running: %w", err)
		}
		if busy = n-g.own > g.limit; busy && g.log != nil {
			g.log(n)
		}
	}
	if !busy && g.maxLag > 0 {
		lag, err := g.lag(ctx)
		if err != nil {
			return false, fmt.Errorf("read changefeed lag: %w", err)
		}
		if busy = lag > g.maxLag; busy && g.logLag != nil {
			g.logLag(lag)
		}
	}
	g.checked, g.busy = time.Now(), busy
	return busy, nil
}

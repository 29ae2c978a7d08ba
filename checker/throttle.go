package checker

// throttle.go owns pacing the run for the servers' sake: the rate cap on rows compared
// and the gate that holds new chunks back while the downstream is busy or its changefeed
// lags. It must not run queries of its own choosing: the gate reads through the probes it
// is given.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tidb-parity/parity/internal/retry"
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
	return retry.Sleep(ctx, wait)
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
	// pauses counts the times the gate closed; paused is how long it stayed closed, in
	// all, up to since (when it last closed, while it is closed).
	pauses int64
	paused time.Duration
	since  time.Time
}

// newBusyGate returns the gate of a run: threads reads the downstream's Threads_running.
func newBusyGate(cfg *Config, threads func(ctx context.Context) (int, error), log *slog.Logger) *busyGate {
	return &busyGate{
		limit:  cfg.MaxThreadsRunning,
		own:    cfg.Concurrency,
		maxLag: cfg.Changefeed.MaxLag,
		lag:    cfg.Lag,
		every:  time.Second,
		probe:  threads,
		log: func(n int) {
			log.Info("downstream busy; pausing", "threads_running", n, "limit", cfg.MaxThreadsRunning)
		},
		logLag: func(lag time.Duration) {
			log.Info("changefeed lagging; pausing", "changefeed", cfg.Changefeed.ID, "lag", lag.Round(time.Millisecond), "max_lag", cfg.Changefeed.MaxLag)
		},
	}
}

// threadsRunning reads a server's Threads_running through withSide.
func threadsRunning(pair *sourcePair, s pairSide) func(ctx context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		var name string
		var n int
		err := pair.withSide(ctx, s, func(ctx context.Context, q Querier) error {
			return queryRow(ctx, q, "SHOW GLOBAL STATUS LIKE 'Threads_running'", &name, &n)
		})
		return n, err
	}
}

// stats returns how often and how long the gate held chunks back, and whether it does now.
func (g *busyGate) stats() (pauses int64, paused time.Duration, pausing bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	paused = g.paused
	if g.busy {
		paused += time.Since(g.since)
	}
	return g.pauses, paused, g.busy
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
		if err := retry.Sleep(ctx, g.every); err != nil {
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
	now := time.Now()
	switch {
	case busy && !g.busy:
		g.pauses++
		g.since = now
	case !busy && g.busy:
		g.paused += now.Sub(g.since)
	}
	g.checked, g.busy = now, busy
	return busy, nil
}

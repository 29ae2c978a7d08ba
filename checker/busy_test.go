package checker

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// syncBuffer is a log sink written by the run's goroutines and read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBusyGateHoldsRun: while the downstream's Threads_running is above
// max_threads_running, a run compares nothing; once it drops, the run goes on and
// finishes. The threads are the test's own statements waiting on a user lock the test
// holds, so they stay running exactly until the test lets them go.
func TestBusyGateHoldsRun(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE bg (id INT PRIMARY KEY, v INT)")
	p.fill(t, "bg", 2000, func(i int) string { return fmt.Sprintf("(%d, %d)", i, i) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// The test holds a user lock; 30 statements wait for it, each taking and dropping it
	// in turn once it is released.
	lock := "parity-busy-" + p.down.Name
	holder, err := p.down.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(ctx, "DO GET_LOCK(?, 0)", lock); err != nil {
		t.Fatal(err)
	}
	const waiters = 30
	var wg sync.WaitGroup
	defer wg.Wait()
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = p.down.DB.ExecContext(ctx, "DO GET_LOCK(?, 60), RELEASE_LOCK(?)", lock, lock)
		}()
	}
	released := false
	release := func() {
		if !released {
			released = true
			if _, err := holder.ExecContext(ctx, "DO RELEASE_LOCK(?)", lock); err != nil {
				t.Error(err)
			}
		}
	}
	defer release()
	threads := func() int {
		var name string
		var n int
		if err := p.down.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE 'Threads_running'").Scan(&name, &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for threads() < waiters {
		if ctx.Err() != nil {
			t.Fatal("the waiting statements did not show in Threads_running")
		}
		time.Sleep(20 * time.Millisecond)
	}

	cfg := p.config(t, "bg")
	cfg.InitialChunkRows, cfg.MaxChunkRows = 200, 200
	cfg.Concurrency = 2
	cfg.MaxThreadsRunning = 10
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	var chunksDone atomic.Int64
	cfg.Progress = func(pr Progress) { chunksDone.Store(int64(pr.ChunksDone)) }
	type result struct {
		rep *Report
		err error
	}
	done := make(chan result, 1)
	d := NewDiff(cfg, nil)
	go func() {
		rep, err := d.Run(ctx)
		done <- result{rep, err}
	}()
	paused := func() bool { return d.Stats().Pausing }
	for !paused() {
		select {
		case r := <-done:
			t.Fatalf("the run ended without pausing (%v):\n%s", r.err, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Held: nothing is compared while the threads run.
	select {
	case r := <-done:
		t.Fatalf("the run ended while the downstream was busy (%v)", r.err)
	case <-time.After(1500 * time.Millisecond):
	}
	if n := chunksDone.Load(); n != 0 {
		t.Fatalf("%d chunks compared while the downstream was busy", n)
	}
	if st := d.Stats(); st.ChunksDone != 0 || !st.Pausing || st.Pauses != 1 || st.Paused < 1500*time.Millisecond || st.Phase != phaseComparing {
		t.Fatalf("stats while held: %+v", st)
	}
	if !strings.Contains(logs.String(), "downstream busy; pausing") {
		t.Errorf("the pause is not logged:\n%s", logs.String())
	}
	release()
	r := <-done
	if r.err != nil {
		t.Fatalf("after the threads ended: %v", r.err)
	}
	if tr := tableReport(t, r.rep, "bg"); !r.rep.Equal || tr.RowsChecked != 2000 || tr.Chunks < 10 {
		t.Fatalf("after the pause: %+v", tr)
	}
	if st := d.Stats(); st.Pausing || st.Pauses < 1 || st.ChunksDone != tableReport(t, r.rep, "bg").Chunks {
		t.Errorf("stats after the run: %+v", st)
	}
}

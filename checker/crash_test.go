package checker

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// crashChildEnv holds the child's Config (JSON) when the test binary runs as the child of
// TestCrashAndResume. The child's upstream hands out crashChildQueries connections and
// then blocks (each chunk takes one, and the table has 60), and once crashChildHold chunks
// are stored as done the child says so and waits to be killed.
const (
	crashChildEnv     = "PARITY_CRASH_CHILD"
	crashChildQueries = 40
	crashChildHold    = 12
)

// TestCrashAndResume runs a diff in a child process, SIGKILLs it mid-run (no cleanup at
// all: the run stays "running", in-flight chunks stay "running"), and resumes it by ID.
// Chunks finished before the kill are not compared again. The kill lands mid-run by
// construction: the child's upstream source blocks after crashChildQueries connections,
// fewer than the run needs, and the child's progress callback (called by the run's journal
// writer) says on stdout once crashChildHold chunks are stored as done.
func TestCrashAndResume(t *testing.T) {
	p := mariaPair(t)
	p.both(t, "CREATE TABLE cr (id INT PRIMARY KEY, v VARCHAR(20))")
	p.fill(t, "cr", 6000, func(i int) string { return fmt.Sprintf("(%d, 'v%d')", i, i) })
	exec(t, p.down.DB, "DELETE FROM cr WHERE id IN (5, 2500, 5999)")
	cfg := p.config(t, "cr")
	cfg.InitialChunkRows, cfg.MinChunkRows, cfg.MaxChunkRows = 100, 100, 100
	cfg.Concurrency = 2
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	child := osexec.Command(os.Args[0])
	child.Env = append(os.Environ(), crashChildEnv+"="+string(data),
		"PARITY_CRASH_UP="+cfg.Upstream.DSN, "PARITY_CRASH_DOWN="+cfg.Downstream.DSN)
	out, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	held := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "held "); ok {
				held <- id
				return
			}
		}
		close(held)
	}()
	var runID string
	select {
	case id, ok := <-held:
		if !ok {
			t.Fatal("the child ended without holding its run")
		}
		runID = id
	case <-time.After(time.Minute):
		t.Fatal("the child made no progress")
	}
	if err := child.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	// A statement the child sent before it died still runs to its end on the server:
	// wait for those, so the states read below are the ones the resume starts from.
	for deadline := time.Now().Add(30 * time.Second); ; {
		var busy int
		if err := p.down.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() AND INFO LIKE '%parity_meta`.diff%'").Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d statements of the killed child still running", busy)
		}
		time.Sleep(10 * time.Millisecond)
	}
	var doneBefore, inFlight, chunks int
	var state string
	if err := p.down.QueryRow("SELECT state FROM "+metaTable("diff_runs")+" WHERE run_id = ?", runID).Scan(&state); err != nil || state != runRunning {
		t.Fatalf("killed run state %q (%v), want running", state, err)
	}
	if err := p.down.QueryRow("SELECT SUM(state = 'done'), SUM(state = 'running'), COUNT(*) FROM "+metaTable("diff_chunks")+" WHERE run_id = ?", runID).Scan(&doneBefore, &inFlight, &chunks); err != nil {
		t.Fatal(err)
	}
	// Mid-run: the chunks stored as done before the hold, and not all 60.
	if doneBefore < crashChildHold || doneBefore >= 60 {
		t.Fatalf("killed with %d of 60 chunks done (%d cut), want at least %d and not all", doneBefore, chunks, crashChildHold)
	}
	cfg.Resume = runID
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := NewDiff(cfg, nil).Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tr := tableReport(t, rep, "cr")
	if tr.RowsChecked != 6000 || tr.DifferencesTotal != 3 || tr.Chunks != 60 {
		t.Fatalf("resumed: rows %d, chunks %d, differences %d", tr.RowsChecked, tr.Chunks, tr.DifferencesTotal)
	}
	var redone int
	if err := p.down.QueryRow("SELECT COUNT(*) FROM "+metaTable("diff_chunks")+" WHERE run_id = ? AND attempts > 1", runID).Scan(&redone); err != nil {
		t.Fatal(err)
	}
	if redone > inFlight {
		t.Errorf("%d chunks compared twice, but only %d were in flight at the kill", redone, inFlight)
	}
	t.Logf("killed with %d chunks done and %d in flight; %d compared twice", doneBefore, inFlight, redone)
}

// crashChild is the child process of TestCrashAndResume (TestMain calls it): it runs the
// diff in crashChildEnv on an upstream that blocks after crashChildQueries connections and,
// once crashChildHold chunks are stored as done, prints "held <run id>" and blocks the
// run's journal until it is killed.
func crashChild() {
	fail := func(err error) {
		fmt.Fprintf(os.Stderr, "crash child: %v\n", err)
		os.Exit(2)
	}
	var cfg Config
	if err := json.Unmarshal([]byte(os.Getenv(crashChildEnv)), &cfg); err != nil {
		fail(err)
	}
	ctx := context.Background()
	up, err := OpenDSN(ctx, os.Getenv("PARITY_CRASH_UP"), cfg.Concurrency, "", cfg.QueryTimeout)
	if err != nil {
		fail(err)
	}
	down, err := OpenDSN(ctx, os.Getenv("PARITY_CRASH_DOWN"), cfg.Concurrency, "", cfg.QueryTimeout)
	if err != nil {
		fail(err)
	}
	meta, err := sql.Open("mysql", os.Getenv("PARITY_CRASH_DOWN"))
	if err != nil {
		fail(err)
	}
	cfg.Progress = func(p Progress) {
		if p.ChunksDone >= crashChildHold {
			fmt.Printf("held %s\n", p.RunID)
			select {} // the journal stores nothing more
		}
	}
	held := &holdingSource{Source: up}
	held.left.Store(crashChildQueries)
	_, err = NewDiff(cfg, &Sources{Upstream: held, Downstream: down, Meta: meta}).Run(ctx)
	fail(fmt.Errorf("the run ended before it was held: %v", err))
}

// holdingSource hands out left connections, then blocks every Acquire for good.
type holdingSource struct {
	Source
	left atomic.Int64
}

func (s *holdingSource) Acquire(ctx context.Context) (Querier, func(), error) {
	if s.left.Add(-1) < 0 {
		select {} // until the process is killed
	}
	return s.Source.Acquire(ctx)
}

package checker

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"testing"
	"time"
)

// TestCrashAndResume runs a diff in a child process, SIGKILLs it mid-run (no cleanup at
// all: the run stays "running", in-flight chunks stay "running"), and resumes it by ID.
// Chunks finished before the kill are not compared again.
func TestCrashAndResume(t *testing.T) {
	if os.Getenv("PARITY_CRASH_CHILD") != "" {
		return // the child is started through TestCrashChild
	}
	p := mariaPair(t)
	p.both(t, "CREATE TABLE cr (id INT PRIMARY KEY, v VARCHAR(20))")
	p.fill(t, "cr", 6000, func(i int) string { return fmt.Sprintf("(%d, 'v%d')", i, i) })
	exec(t, p.down.DB, "DELETE FROM cr WHERE id IN (5, 2500, 5999)")
	cfg := p.config(t, "cr")
	cfg.InitialChunkRows, cfg.MinChunkRows, cfg.MaxChunkRows = 100, 100, 100
	cfg.Concurrency = 2
	cfg.MaxRowsPerSecond = 6000 // about a second: time to kill it half-way
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	child := osexec.Command(os.Args[0], "-test.run=^TestCrashChild$")
	child.Env = append(os.Environ(), "PARITY_CRASH_CHILD="+string(data),
		"PARITY_CRASH_UP="+cfg.Upstream.DSN, "PARITY_CRASH_DOWN="+cfg.Downstream.DSN)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the child's run has finished some chunks, then kill it.
	var runID string
	deadline := time.Now().Add(60 * time.Second)
	for {
		var done int
		err := p.down.QueryRow(`SELECT r.run_id, COUNT(*) FROM parity_meta.diff_runs r JOIN parity_meta.diff_tables t USING (run_id)
			JOIN parity_meta.diff_chunks c ON c.run_id = r.run_id AND c.table_idx = t.table_idx
			WHERE t.down_schema = ? AND c.state = 'done' GROUP BY r.run_id`, p.down.Name).Scan(&runID, &done)
		if err == nil && done >= 10 {
			break
		}
		if time.Now().After(deadline) {
			_ = child.Process.Kill()
			t.Fatal("child made no progress")
		}
		time.Sleep(20 * time.Millisecond)
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
	var doneBefore, inFlight int
	var state string
	if err := p.down.QueryRow("SELECT state FROM parity_meta.diff_runs WHERE run_id = ?", runID).Scan(&state); err != nil || state != RunRunning {
		t.Fatalf("killed run state %q (%v), want running", state, err)
	}
	if err := p.down.QueryRow("SELECT SUM(state = 'done'), SUM(state = 'running') FROM parity_meta.diff_chunks WHERE run_id = ?", runID).Scan(&doneBefore, &inFlight); err != nil {
		t.Fatal(err)
	}
	if doneBefore >= 60 {
		t.Skipf("the child finished before the kill (%d chunks done)", doneBefore)
	}
	cfg.Resume = runID
	cfg.MaxRowsPerSecond = 0
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := tableReport(t, rep, "cr")
	if tr.RowsChecked != 6000 || tr.DifferencesTotal != 3 {
		t.Fatalf("resumed: rows %d, differences %d", tr.RowsChecked, tr.DifferencesTotal)
	}
	var redone int
	if err := p.down.QueryRow("SELECT COUNT(*) FROM parity_meta.diff_chunks WHERE run_id = ? AND attempts > 1", runID).Scan(&redone); err != nil {
		t.Fatal(err)
	}
	if redone > inFlight {
		t.Errorf("%d chunks compared twice, but only %d were in flight at the kill", redone, inFlight)
	}
	t.Logf("killed with %d chunks done and %d in flight; %d compared twice", doneBefore, inFlight, redone)
}

// TestCrashChild is the child process of TestCrashAndResume.
func TestCrashChild(t *testing.T) {
	data := os.Getenv("PARITY_CRASH_CHILD")
	if data == "" {
		t.Skip("only runs as the child of TestCrashAndResume")
	}
	var cfg Config
	if err := json.Unmarshal([]byte(data), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Upstream.DSN, cfg.Downstream.DSN = os.Getenv("PARITY_CRASH_UP"), os.Getenv("PARITY_CRASH_DOWN")
	_, _ = Run(context.Background(), cfg)
	time.Sleep(time.Minute) // wait to be killed
}

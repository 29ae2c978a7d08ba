package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ensureReladiff creates the reladiff venv when the executable is missing.
func ensureReladiff(ctx context.Context, exe string) error {
	if _, err := os.Stat(exe); err == nil {
		return nil
	}
	venv := filepath.Dir(filepath.Dir(exe))
	slog.Info("installing reladiff", "venv", venv)
	for _, argv := range [][]string{
		{"python3", "-m", "venv", venv},
		{filepath.Join(venv, "bin", "pip"), "install", "-q", "reladiff[mysql]"},
	} {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("install reladiff (%s): %w", strings.Join(argv, " "), err)
		}
	}
	if _, err := os.Stat(exe); err != nil {
		return fmt.Errorf("install reladiff: %s missing after pip install", exe)
	}
	return nil
}

// reladiffURI builds reladiff's connection string: mysql://user@host:port/db.
func reladiffURI(t *Table) string {
	return fmt.Sprintf("mysql://%s@%s/%s", t.S.User(), t.S.Addr(), t.DB)
}

// runReladiff runs reladiff's cross-database hashdiff over the pair, comparing every
// non-key column (-c k -c c -c pad), with --json so each differing row is one JSONL line.
// A row reladiff prints with '-' only is missing downstream, '+' only is extra, both is
// a changed row.
func runReladiff(ctx context.Context, o options, p *pair, logPath string) (Result, error) {
	args := []string{
		reladiffURI(p.up), p.up.Name, reladiffURI(p.down), p.down.Name,
		"-k", "id", "-c", "k", "-c", "c", "-c", "pad",
		"--threads", strconv.Itoa(o.threads), "--json",
	}
	cmd := exec.CommandContext(ctx, o.reladiff, args...)
	// rich wraps lines at the terminal width; a huge width keeps one row per line.
	cmd.Env = append(os.Environ(), "COLUMNS=100000", "NO_COLOR=1", "TERM=dumb")
	var stdout bytes.Buffer
	logf, err := os.Create(logPath)
	if err != nil {
		return Result{}, err
	}
	defer logf.Close()
	cmd.Stdout = &stdout
	cmd.Stderr = logf
	fmt.Fprintf(logf, "$ %s %s\n", o.reladiff, strings.Join(args, " "))
	res, err := timeProcess(cmd)
	if err != nil {
		return res, fmt.Errorf("reladiff %s (log %s): %w", p.label, logPath, err)
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		return res, fmt.Errorf("reladiff %s exited %d (log %s)", p.label, code, logPath)
	}
	_ = os.WriteFile(strings.TrimSuffix(logPath, ".log")+".out", stdout.Bytes(), 0o644)
	minus, plus := map[int64]bool{}, map[int64]bool{}
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var rec []json.RawMessage
		if err := json.Unmarshal([]byte(line), &rec); err != nil || len(rec) != 2 {
			return res, fmt.Errorf("reladiff output line %q: not [op, values]", trunc(line, 80))
		}
		var op string
		var values []any
		if err := json.Unmarshal(rec[0], &op); err != nil {
			return res, fmt.Errorf("reladiff output line %q: %w", trunc(line, 80), err)
		}
		if err := json.Unmarshal(rec[1], &values); err != nil || len(values) == 0 {
			return res, fmt.Errorf("reladiff output line %q: bad values", trunc(line, 80))
		}
		id, err := strconv.ParseInt(fmt.Sprint(values[0]), 10, 64)
		if err != nil {
			return res, fmt.Errorf("reladiff output line %q: key: %w", trunc(line, 80), err)
		}
		switch op {
		case "-":
			minus[id] = true
		case "+":
			plus[id] = true
		default:
			return res, fmt.Errorf("reladiff output line %q: op %q", trunc(line, 80), op)
		}
	}
	for id := range minus {
		if plus[id] {
			res.Found = append(res.Found, Difference{Kind: Changed, ID: id})
		} else {
			res.Found = append(res.Found, Difference{Kind: Missing, ID: id})
		}
	}
	for id := range plus {
		if !minus[id] {
			res.Found = append(res.Found, Difference{Kind: Extra, ID: id})
		}
	}
	return res, nil
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Result is one timed run of one tool.
type Result struct {
	Wall     time.Duration
	MaxRSSKB int64         // 0 when not measured (the in-process bare loop)
	CPU      time.Duration // the process's own user+sys CPU time (0 for the bare loop)
	Found    []Difference
	Chunks   int             // chunk queries per side (bare loop), or as reported
	Note     string          // anything worth printing next to the numbers
	runID    string          // parity's run (to find its chunks)
	Runs     []time.Duration // every repeat's wall time
	fixFile  string          // parity's fix SQL file
	Err      error
}

package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// caseResult holds the three tools' results for one pair and one case.
type caseResult struct {
	pair     *pair
	name     string // identical, differences
	want     []Difference
	parity   Result
	reladiff Result
	floor    Result
	// Lower bounds (identical case only): the bare loop with checker.ChunkSQL.LowerBound's
	// "read" and "crc32" instead of the checksum.
	readBound, crcBound Result
	fixOK               *bool // parity's fix SQL made the downstream equal (differences case)
	fixNote             string
}

func bench(ctx context.Context, o options, data Dataset, want Expected, plan []Difference, pairs []*pair) error {
	if o.parity == "" {
		o.parity = filepath.Join(o.workDir, "parity")
		slog.Info("building parity", "output", o.parity)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", o.parity, "./cmd/parity")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build parity: %w", err)
		}
	}
	o.parity = absPath(o.parity)
	if !o.noReladiff && !o.dirtyOnly {
		if err := ensureReladiff(ctx, o.reladiff); err != nil {
			return err
		}
	}

	if o.hashes && !o.dirtyOnly {
		var tables []*Table
		seen := map[string]bool{}
		for _, p := range pairs {
			for _, t := range []*Table{p.up, p.down} {
				if !seen[t.S.Name] {
					seen[t.S.Name] = true
					tables = append(tables, t)
				}
			}
		}
		slog.Info("timing per-row hash alternatives")
		if err := benchHashes(ctx, os.Stdout, tables); err != nil {
			return err
		}
	}

	// reladiff's wall times include the Python interpreter's start; show what that is.
	if res, err := timeProcess(exec.CommandContext(ctx, o.reladiff, "--version")); err == nil && !o.noReladiff {
		o.reladiffStart = res.Wall
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		o.loadavg = strings.TrimSpace(string(la))
	}
	var results []*caseResult
	var dirtyPair *pair
	for _, p := range pairs {
		if p.name == "tidb" {
			dirtyPair = p
		}
		if o.dirtyOnly {
			continue
		}
		for _, c := range []struct {
			name string
			want []Difference
		}{{"identical", nil}, {"differences", plan}} {
			r, err := runCase(ctx, o, p, c.name, c.want, want)
			if r != nil {
				results = append(results, r)
			}
			if err != nil {
				printResults(os.Stdout, o, results)
				return err
			}
		}
	}
	printResults(os.Stdout, o, results)
	if o.dirty > 0 && dirtyPair != nil {
		r, err := benchDirty(ctx, o, data, dirtyPair)
		if err != nil {
			return fmt.Errorf("cdc-scope case: %w", err)
		}
		for _, c := range results {
			if c.pair == dirtyPair && c.name == "identical" {
				r.full = c.parity.Wall
			}
		}
		printDirty(os.Stdout, r, data.Rows)
	}
	return nil
}

// runCase injects the case's differences into the downstream copy, runs the three tools,
// and reverts the downstream (verifying it holds the dataset again).
func runCase(ctx context.Context, o options, p *pair, name string, diffs []Difference, want Expected) (r *caseResult, err error) {
	r = &caseResult{pair: p, name: name, want: diffs}
	dir := filepath.Join(o.workDir, p.name+"-"+name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if len(diffs) > 0 {
		slog.Info("injecting differences", "pair", p.label, "downstream", p.down.S.Name, "count", len(diffs))
		defer func() {
			// Revert even when a tool failed or the run was interrupted.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
			defer cancel()
			if rerr := p.down.Revert(rctx, diffs); rerr != nil {
				err = fmt.Errorf("%w; %w", err, rerr)
				return
			}
			got, cerr := p.down.Checksum(rctx)
			if cerr == nil && got != want {
				cerr = fmt.Errorf("%s %s still differs from the dataset after revert: %+v, want %+v", p.down.S.Name, p.down.qname(), got, want)
			}
			if cerr != nil {
				err = fmt.Errorf("%w; %w", err, cerr)
			}
		}()
		if err := p.down.Inject(ctx, diffs); err != nil {
			return nil, err
		}
	}

	// Repeats are interleaved (parity, bare loop, reladiff, parity, ...) so that load from
	// elsewhere on the machine hits every tool alike; the fastest run of each tool counts.
	for i := 0; i < max(o.repeat, 1); i++ {
		slog.Info("running parity", "pair", p.label, "case", name, "repeat", i+1)
		pr, err := runParity(ctx, o, p, filepath.Join(dir, fmt.Sprintf("parity-%d", i+1)))
		if err != nil {
			return r, err
		}
		slog.Info("parity done", "seconds", pr.Wall.Seconds(), "found", len(pr.Found), "chunks", pr.Chunks)
		r.parity = best(r.parity, pr)

		slog.Info("running bare checksum loop", "pair", p.label, "case", name, "repeat", i+1)
		fr, err := runFloor(ctx, o, p, pr, "")
		if err != nil {
			return r, err
		}
		slog.Info("bare loop done", "seconds", fr.Wall.Seconds(), "chunks", fr.Chunks)
		r.floor = best(r.floor, fr)
		if len(diffs) == 0 && o.bounds {
			for _, b := range []struct {
				bound string
				res   *Result
			}{{"read", &r.readBound}, {"crc32", &r.crcBound}} {
				br, err := runFloor(ctx, o, p, pr, b.bound)
				if err != nil {
					return r, err
				}
				slog.Info("lower bound done", "bound", b.bound, "seconds", br.Wall.Seconds())
				*b.res = best(*b.res, br)
			}
		}

		if o.noReladiff {
			continue
		}
		slog.Info("running reladiff", "pair", p.label, "case", name, "repeat", i+1)
		rr, err := runReladiff(ctx, o, p, filepath.Join(dir, fmt.Sprintf("reladiff-%d.log", i+1)))
		if err != nil {
			return r, err
		}
		slog.Info("reladiff done", "seconds", rr.Wall.Seconds(), "found", len(rr.Found))
		r.reladiff = best(r.reladiff, rr)
	}
	if len(diffs) > 0 {
		slog.Info("applying parity's fix SQL to the downstream copy", "pair", p.label, "file", r.parity.fixFile)
		ok, note, err := applyFix(ctx, p.down, r.parity.fixFile, want)
		if err != nil {
			return r, err
		}
		r.fixOK, r.fixNote = &ok, note
	}
	return r, nil
}

// timeProcess runs cmd and returns its wall time and max RSS (from wait4's rusage).
func timeProcess(cmd *exec.Cmd) (Result, error) {
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Result{}, err
	}
	err := cmd.Wait()
	res := Result{Wall: time.Since(start)}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.MaxRSSKB = ru.Maxrss // kilobytes on Linux
		res.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if _, exit := err.(*exec.ExitError); exit {
		err = nil // the caller interprets the exit code
	}
	return res, err
}

// compareFound checks found against want: the same set of (kind, id), and for changed
// rows the same column when found carries one.
func compareFound(want, found []Difference) (ok bool, detail string) {
	key := func(d Difference) string { return fmt.Sprintf("%s:%d", d.Kind, d.ID) }
	w := map[string]Difference{}
	for _, d := range want {
		w[key(d)] = d
	}
	f := map[string]Difference{}
	var dup []string
	for _, d := range found {
		if _, seen := f[key(d)]; seen {
			dup = append(dup, key(d))
		}
		f[key(d)] = d
	}
	var missed, bogus, badCol []string
	for k, d := range w {
		g, hit := f[k]
		if !hit {
			missed = append(missed, k)
			continue
		}
		if d.Kind == Changed && g.Column != "" && g.Column != d.Column {
			badCol = append(badCol, fmt.Sprintf("%s (columns %s, want %s)", k, g.Column, d.Column))
		}
	}
	for k := range f {
		if _, hit := w[k]; !hit {
			bogus = append(bogus, k)
		}
	}
	var parts []string
	for _, x := range []struct {
		label string
		keys  []string
	}{{"not found", missed}, {"not injected", bogus}, {"wrong columns", badCol}, {"reported twice", dup}} {
		if len(x.keys) > 0 {
			sort.Strings(x.keys)
			parts = append(parts, fmt.Sprintf("%d %s: %s", len(x.keys), x.label, trunc(strings.Join(x.keys, " "), 200)))
		}
	}
	if len(parts) == 0 {
		return true, ""
	}
	return false, strings.Join(parts, "; ")
}

// kindCounts formats the found differences as changed/missing/extra counts.
func kindCounts(ds []Difference) string {
	var c, m, e int
	for _, d := range ds {
		switch d.Kind {
		case Changed:
			c++
		case Missing:
			m++
		case Extra:
			e++
		}
	}
	return fmt.Sprintf("%d (%d changed, %d missing, %d extra)", len(ds), c, m, e)
}

// best keeps the faster of two runs of a tool; every run's result must be correct, so a
// wrong run is kept whatever its speed, and max RSS is the largest seen.
func best(prev, cur Result) Result {
	if prev.Wall == 0 {
		cur.Runs = []time.Duration{cur.Wall}
		return cur
	}
	out := prev
	if prev.Err == nil && (cur.Err != nil || cur.Wall < prev.Wall) {
		out = cur
	}
	out.Runs = append(prev.Runs, cur.Wall)
	out.MaxRSSKB = max(prev.MaxRSSKB, cur.MaxRSSKB)
	if prev.Err != nil && cur.Err == nil {
		out.Err = prev.Err
	}
	return out
}

package fleet

// verify.go owns fleet verification: a run on every member whose first pair is the
// fleet point T, its differences named by member, table, key and class.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/internal/retry"
)

// MaxDifferences bounds the differences a fleet result lists per member (the runs have
// them all).
const MaxDifferences = 1000

// VerifyRequest asks for a fleet verification.
type VerifyRequest struct {
	// Scope is full, cdc or since:<TSO|time> (each member's verify scopes).
	Scope string
	// MaxRowsPerSecond caps each member's run (0: its verify.max-rows-per-second).
	MaxRowsPerSecond int64
}

// Difference is one differing row, named by member.
type Difference struct {
	Member  string   `json:"member"`
	Table   string   `json:"table"`
	Key     string   `json:"key"`
	Kind    string   `json:"kind"`
	Class   string   `json:"class"`
	Columns []string `json:"columns,omitempty"`
}

// MemberRun is one member's part of a fleet verification or cutover check.
type MemberRun struct {
	Member string `json:"member"`
	// Addr is the daemon that ran it; RunID its run.
	Addr  string `json:"addr,omitempty"`
	RunID string `json:"run_id,omitempty"`
	// Result: equal, different, failed, cancelled; for a cutover check passed or
	// not-passed; "no-answer" when the member did not answer, and Error says why.
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
	// PairTS is the member's (first) snapshot pair's TSO (the fleet's T),
	// PairPosition the fallback's position there, Pause how long its applier held T.
	PairTS       uint64        `json:"pair_ts,omitempty"`
	PairPosition string        `json:"pair_position,omitempty"`
	Pause        time.Duration `json:"pause_ns"`
	// Tables compared, keys (rows) verified and differences, by class.
	Tables      []string         `json:"tables,omitempty"`
	Keys        int64            `json:"keys_verified"`
	Differences int64            `json:"differences"`
	ByClass     map[string]int64 `json:"differences_by_class,omitempty"`
	// Failures are a cutover check's own lines (why the member did not pass).
	Failures []string `json:"failures,omitempty"`
	// Took is the member's wall time.
	Took time.Duration `json:"took_ns"`
}

// VerifyResult is a fleet verification.
type VerifyResult struct {
	Fleet string `json:"fleet"`
	// T is the fleet point: every member's first pair is at T. Attempts counts the Ts
	// tried.
	T        uint64 `json:"t"`
	Attempts int    `json:"attempts"`
	// Result is equal (every member's run equal), different or failed.
	Result  string      `json:"result"`
	Members []MemberRun `json:"members"`
	// Differences are the members' differing rows (at most MaxDifferences a member).
	Differences []Difference `json:"differences,omitempty"`
	// MaxPause is the slowest member's pause at T; Took the whole verification's time.
	MaxPause time.Duration `json:"max_pause_ns"`
	Took     time.Duration `json:"took_ns"`
}

// Verify verifies every member at one fleet point T: each member's run (over the tables
// it owns) opens its first pair at exactly T.
func (f *Fleet) Verify(ctx context.Context, req VerifyRequest) (VerifyResult, error) {
	start := time.Now()
	res := VerifyResult{Fleet: f.cfg.Fleet.Name}
	if _, err := f.Tables(ctx); err != nil {
		return res, err
	}
	t, n, err := f.atPoint(ctx, func(ctx context.Context, t uint64) error {
		runs, err := f.startRuns(ctx, req, t)
		if err != nil {
			return err
		}
		res.Members = runs
		return f.waitRuns(ctx, t, res.Members)
	})
	res.T, res.Attempts = t, n
	if err != nil {
		return res, err
	}
	res.Result = "equal"
	for i := range res.Members {
		mr := &res.Members[i]
		res.MaxPause = max(res.MaxPause, mr.Pause)
		switch {
		case mr.Result == "different":
			if res.Result == "equal" {
				res.Result = "different"
			}
			ds, err := f.members[i].differences(ctx, mr)
			if err != nil {
				mr.Error = fmt.Sprintf("listing its differences: %v", err)
			}
			res.Differences = append(res.Differences, ds...)
		case mr.Result != "equal":
			res.Result = "failed"
		}
	}
	res.Took = time.Since(start)
	return res, nil
}

// startRuns starts a run at exactly t on every member; a member that refuses t makes
// it errPassed (the started runs are cancelled).
func (f *Fleet) startRuns(ctx context.Context, req VerifyRequest, t uint64) ([]MemberRun, error) {
	runs := make([]MemberRun, len(f.members))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for i, m := range f.members {
		g.Go(func() error {
			var d *parityv1.Diff
			var addr string
			err := m.call(gctx, f.cfg.Fleet.Failover, func(ctx context.Context, c parityv1.ParityClient, a string) error {
				cctx, cancel := context.WithTimeout(ctx, f.cfg.Fleet.CallTimeout)
				defer cancel()
				var err error
				d, err = c.StartDiff(cctx, &parityv1.StartDiffRequest{Scope: req.Scope, Tables: m.cfg.Owns,
					SnapshotPolicy: &parityv1.SnapshotPolicy{AtTs: t},
					Options:        &parityv1.DiffOptions{MaxRowsPerSecond: req.MaxRowsPerSecond}})
				addr = a
				return err
			})
			mu.Lock()
			defer mu.Unlock()
			runs[i] = MemberRun{Member: m.cfg.Name, Addr: addr, RunID: d.GetRunId()}
			switch {
			case err != nil && pairPassed(err):
				return fmt.Errorf("member %s: %w: %v", m.cfg.Name, errPassed, err)
			case err != nil:
				return fmt.Errorf("member %s: starting its run at %d: %w", m.cfg.Name, t, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		f.cancelRuns(ctx, runs)
		return nil, err
	}
	return runs, nil
}

// cancelRuns cancels the runs started (on a failed fleet point), within a bound.
func (f *Fleet) cancelRuns(ctx context.Context, runs []MemberRun) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.Fleet.CallTimeout)
	defer cancel()
	for i, r := range runs {
		if r.RunID == "" {
			continue
		}
		_ = f.members[i].call(cctx, 0, func(ctx context.Context, c parityv1.ParityClient, _ string) error {
			_, err := c.CancelDiff(ctx, &parityv1.CancelDiffRequest{Name: "diffs/" + r.RunID})
			return err
		})
	}
}

// waitRuns follows every member's run to its end. A run that failed before its pair
// because its member had applied past t makes it errPassed (the others are cancelled).
func (f *Fleet) waitRuns(ctx context.Context, t uint64, runs []MemberRun) error {
	g, gctx := errgroup.WithContext(ctx)
	for i, m := range f.members {
		g.Go(func() error {
			mr := &runs[i]
			start := time.Now()
			d, err := m.waitRun(gctx, f.cfg.Fleet, mr.RunID)
			mr.Took = time.Since(start)
			if err != nil {
				mr.Result, mr.Error = "no-answer", err.Error()
				return nil
			}
			fill(mr, d)
			if mr.Result == "failed" && len(d.GetPairs()) == 0 {
				if _, st, err := m.find(gctx); err == nil && st.GetAppliedTs() > t {
					return fmt.Errorf("member %s: %w (its run: %s)", m.cfg.Name, errPassed, d.GetError())
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		f.cancelRuns(ctx, runs)
		return err
	}
	return nil
}

// waitRun polls the run until it ended.
func (m *member) waitRun(ctx context.Context, s Settings, runID string) (*parityv1.Diff, error) {
	for {
		var d *parityv1.Diff
		err := m.call(ctx, s.Failover, func(ctx context.Context, c parityv1.ParityClient, _ string) error {
			cctx, cancel := context.WithTimeout(ctx, s.CallTimeout)
			defer cancel()
			var err error
			d, err = c.GetDiff(cctx, &parityv1.GetDiffRequest{Name: "diffs/" + runID})
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("following run %s: %w", runID, err)
		}
		switch d.GetState() {
		case parityv1.DiffState_DIFF_STATE_DONE, parityv1.DiffState_DIFF_STATE_FAILED,
			parityv1.DiffState_DIFF_STATE_CANCELLED, parityv1.DiffState_DIFF_STATE_SKIPPED:
			return d, nil
		}
		if err := retry.Sleep(ctx, 500*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// fill sets a member's run from its ended run.
func fill(mr *MemberRun, d *parityv1.Diff) {
	mr.Result = resultName(d.GetResult())
	mr.Error = d.GetError()
	mr.Keys, mr.Differences, mr.ByClass = d.GetRowsChecked(), d.GetDifferences(), d.GetDifferencesByClass()
	if ps := d.GetPairs(); len(ps) > 0 {
		mr.PairTS, mr.PairPosition, mr.Pause = ps[0].GetTs(), ps[0].GetDownstreamPosition(), ps[0].GetPause().AsDuration()
	}
	for _, tr := range d.GetTableResults() {
		mr.Tables = append(mr.Tables, tr.GetTable())
	}
}

// differences lists a member's run's differences (at most MaxDifferences).
func (m *member) differences(ctx context.Context, mr *MemberRun) ([]Difference, error) {
	var out []Difference
	token := ""
	for len(out) < MaxDifferences {
		var resp *parityv1.ListDifferencesResponse
		err := m.call(ctx, 0, func(ctx context.Context, c parityv1.ParityClient, _ string) error {
			cctx, cancel := context.WithTimeout(ctx, m.timeout)
			defer cancel()
			var err error
			resp, err = c.ListDifferences(cctx, &parityv1.ListDifferencesRequest{Parent: "diffs/" + mr.RunID, PageSize: 1000, PageToken: token})
			return err
		})
		if err != nil {
			return out, err
		}
		for _, d := range resp.GetDifferences() {
			out = append(out, Difference{Member: m.cfg.Name, Table: d.GetTable(), Key: d.GetKey(),
				Kind: client.EnumName(d.GetKind().String(), "DIFFERENCE_KIND_"), Class: d.GetClass(), Columns: d.GetColumns()})
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	return out[:min(len(out), MaxDifferences)], nil
}

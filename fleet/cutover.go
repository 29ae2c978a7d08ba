package fleet

// cutover.go owns the fleet cutover check: once writes stopped, every member checks its
// fallback at one T concurrently, and the fleet passes only when every member passed at
// T and every selected table is owned by a member that passed and vouched for it.

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/durationpb"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// CutoverRequest asks for a fleet cutover check.
type CutoverRequest struct {
	// MaxFullAge, Full and FullTables are each member's (see `parity cutover-check`).
	MaxFullAge time.Duration
	Full       bool
	FullTables []string
	// Wait bounds each member's wait for its applier to reach T (0: the member's
	// default, 10 min).
	Wait time.Duration
}

// CutoverResult is a fleet cutover check's evidence.
type CutoverResult struct {
	Fleet string `json:"fleet"`
	// Passed: every member passed at T and every selected table was vouched for by its
	// owner. Failures say why not, each naming its member or table.
	Passed   bool     `json:"passed"`
	Failures []string `json:"failures,omitempty"`
	// T is the one TSO every member was checked at; Attempts counts the Ts tried.
	T        uint64 `json:"t"`
	Attempts int    `json:"attempts"`
	// Tables are the selected tables and their owners.
	Tables  map[string]string `json:"tables"`
	Members []MemberRun       `json:"members"`
	// MaxPause is the slowest member's pause at T, Slowest the longest member check;
	// Took the fleet check's wall time.
	MaxPause time.Duration `json:"max_pause_ns"`
	Slowest  time.Duration `json:"slowest_member_ns"`
	Took     time.Duration `json:"took_ns"`
}

// NoAnswer reports whether the check failed only because members did not answer (no
// member answered that it did not pass): the runbook's "no answer", not "not clean".
func (r CutoverResult) NoAnswer() bool {
	if r.Passed {
		return false
	}
	none := false
	for _, m := range r.Members {
		switch m.Result {
		case "not-passed":
			return false
		case "no-answer":
			none = true
		}
	}
	return none
}

// CutoverCheck checks every member at one T, TiDB's current TSO once writes stopped.
// A member refusing T (it applied past it) retries the whole fleet at a newer T; a
// member whose daemon dies is followed to its standby (fleet.failover) and asked again
// at T; a member not heard from fails the check, named.
func (f *Fleet) CutoverCheck(ctx context.Context, req CutoverRequest) (CutoverResult, error) {
	start := time.Now()
	res := CutoverResult{Fleet: f.cfg.Fleet.Name}
	owner, err := f.Tables(ctx)
	if err != nil {
		return res, err
	}
	res.Tables = owner
	var resps []*parityv1.CutoverCheckResponse
	t, n, err := f.atPoint(ctx, func(ctx context.Context, t uint64) error {
		var err error
		res.Members, resps, err = f.checkAt(ctx, req, t)
		return err
	})
	res.T, res.Attempts = t, n
	if err != nil {
		return res, err
	}
	res.Passed = true
	vouched := map[string]map[string]bool{} // member → tables it passed
	for i := range res.Members {
		mr := &res.Members[i]
		res.MaxPause, res.Slowest = max(res.MaxPause, mr.Pause), max(res.Slowest, mr.Took)
		r := resps[i]
		switch {
		case r == nil:
			res.Passed = false
			res.Failures = append(res.Failures, fmt.Sprintf("member %s: no answer: %s", mr.Member, mr.Error))
			continue
		case !r.GetPassed():
			res.Passed = false
			for _, l := range r.GetFailures() {
				res.Failures = append(res.Failures, fmt.Sprintf("member %s: %s", mr.Member, l))
			}
			if len(r.GetFailures()) == 0 {
				res.Failures = append(res.Failures, fmt.Sprintf("member %s: did not pass", mr.Member))
			}
			continue
		case mr.PairTS != t:
			res.Passed = false
			res.Failures = append(res.Failures, fmt.Sprintf("member %s: checked at %d, not at the fleet's T %d", mr.Member, mr.PairTS, t))
			continue
		}
		v := map[string]bool{}
		for _, ct := range r.GetTables() {
			if ct.GetResult() == "equal" {
				v[ct.GetTable()] = true
			}
		}
		vouched[mr.Member] = v
	}
	tables := make([]string, 0, len(owner))
	for t := range owner {
		tables = append(tables, t)
	}
	sort.Strings(tables)
	for _, tb := range tables {
		m := owner[tb]
		v, ok := vouched[m]
		if ok && !v[tb] {
			res.Passed = false
			res.Failures = append(res.Failures, fmt.Sprintf("table %s: its owner %s passed without verifying it (is it in the member's verify.tables?)", tb, m))
		}
	}
	res.Took = time.Since(start)
	return res, nil
}

// checkAt runs every member's cutover check at exactly t, concurrently. A member that
// refuses t makes it errPassed (the others' calls are cancelled); a member that does
// not answer is a MemberRun with Result "no-answer" and a nil response.
func (f *Fleet) checkAt(ctx context.Context, req CutoverRequest, t uint64) ([]MemberRun, []*parityv1.CutoverCheckResponse, error) {
	runs := make([]MemberRun, len(f.members))
	resps := make([]*parityv1.CutoverCheckResponse, len(f.members))
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	for i, m := range f.members {
		g.Go(func() error {
			start := time.Now()
			var r *parityv1.CutoverCheckResponse
			var addr string
			pr := &parityv1.CutoverCheckRequest{Upstream: &parityv1.CutoverCheckRequest_UpstreamTs{UpstreamTs: t}, ExactPair: true,
				Tables: m.cfg.Owns, Full: req.Full, FullTables: req.FullTables}
			if req.MaxFullAge > 0 {
				pr.MaxFullDiffAge = durationpb.New(req.MaxFullAge)
			}
			if req.Wait > 0 {
				pr.WaitTimeout = durationpb.New(req.Wait)
			}
			err := m.call(gctx, f.cfg.Fleet.Failover, func(ctx context.Context, c parityv1.ParityClient, a string) error {
				var err error
				addr = a
				r, err = c.CutoverCheck(ctx, pr)
				return err
			})
			mr := MemberRun{Member: m.cfg.Name, Addr: addr, Took: time.Since(start)}
			switch {
			case err != nil && pairPassed(err):
				return fmt.Errorf("member %s: %w: %v", m.cfg.Name, errPassed, err)
			case err != nil:
				mr.Result, mr.Error = "no-answer", err.Error()
			default:
				mr.Result = "not-passed"
				if r.GetPassed() {
					mr.Result = "passed"
				}
				mr.RunID = r.GetDiff()
				mr.PairTS, mr.PairPosition, mr.Pause = r.GetPair().GetTs(), r.GetPair().GetDownstreamPosition(), r.GetPair().GetPause().AsDuration()
				mr.Keys, mr.ByClass, mr.Failures = r.GetKeysVerified(), r.GetDifferencesByClass(), r.GetFailures()
				for _, ct := range r.GetTables() {
					mr.Tables = append(mr.Tables, ct.GetTable())
					mr.Differences += ct.GetDifferences()
				}
			}
			mu.Lock()
			runs[i], resps[i] = mr, r
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	return runs, resps, nil
}

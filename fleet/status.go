package fleet

// status.go owns the fleet's status: each member's as its active daemon reports it,
// and the fleet's lag, the worst member's.

import (
	"context"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// MemberStatus is one member's status.
type MemberStatus struct {
	Member string `json:"member"`
	// Addr is the daemon that answered (the active one); "" when none did, and Error
	// says why.
	Addr  string `json:"addr,omitempty"`
	Error string `json:"error,omitempty"`
	// Instance is the answering daemon's instance name; State its applier's state.
	Instance string `json:"instance,omitempty"`
	State    string `json:"state,omitempty"`
	// AppliedTS is the member's applied checkpoint, AppliedLag its age.
	AppliedTS  uint64  `json:"applied_ts,omitempty"`
	AppliedLag float64 `json:"applied_lag_seconds"`
	// Verified: a clean full verification is known; Freshness is the age of the oldest
	// applied change no clean verification covers (seconds; -1 when not verified).
	Verified  bool    `json:"verified"`
	Freshness float64 `json:"freshness_seconds"`
	// LastRun and LastResult are the newest ended verification run and its result.
	LastRun    string `json:"last_run,omitempty"`
	LastResult string `json:"last_result,omitempty"`
	// Takeovers counts the leases the answering daemon took (with [ha]).
	Takeovers int64 `json:"takeovers,omitempty"`
	// Bypass is the member's bypass detector's state ("off" without one), Detections
	// the writes straight into its fallback it recorded since it started, BypassLag its
	// lag (seconds).
	Bypass     string  `json:"bypass"`
	Detections int64   `json:"bypass_detections"`
	BypassLag  float64 `json:"bypass_lag_seconds"`
}

// Status is the fleet's status.
type Status struct {
	Fleet   string         `json:"fleet"`
	Members []MemberStatus `json:"members"`
	// Lag is the worst member's applied lag (seconds), WorstMember that member;
	// Unreachable counts members no daemon of which answered as active.
	Lag         float64 `json:"lag_seconds"`
	WorstMember string  `json:"worst_member,omitempty"`
	Unreachable int     `json:"unreachable"`
}

// Status asks every member for its status, concurrently.
func (f *Fleet) Status(ctx context.Context) Status {
	out := Status{Fleet: f.cfg.Fleet.Name, Members: make([]MemberStatus, len(f.members))}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, m := range f.members {
		g.Go(func() error {
			ms := m.status(gctx)
			mu.Lock()
			out.Members[i] = ms
			mu.Unlock()
			return nil
		})
	}
	_ = g.Wait()
	for _, ms := range out.Members {
		if ms.Addr == "" {
			out.Unreachable++
			continue
		}
		if out.WorstMember == "" || ms.AppliedLag > out.Lag {
			out.Lag, out.WorstMember = ms.AppliedLag, ms.Member
		}
	}
	return out
}

func (m *member) status(ctx context.Context) MemberStatus {
	ms := MemberStatus{Member: m.cfg.Name, Freshness: -1}
	i, st, err := m.find(ctx)
	if err != nil {
		ms.Error = err.Error()
		return ms
	}
	ms.Addr, ms.Instance = m.cfg.Addrs[i], st.GetInstance()
	ms.State = stateName(st.GetApplierState())
	ms.AppliedTS, ms.AppliedLag = st.GetAppliedTs(), st.GetAppliedLagSeconds()
	if v := st.GetVerification(); v != nil {
		ms.Verified = v.GetVerified()
		if v.GetFreshness() != nil {
			ms.Freshness = v.GetFreshness().AsDuration().Seconds()
		}
		if d := v.GetLastDiff(); d != nil {
			ms.LastRun, ms.LastResult = d.GetRunId(), resultName(d.GetResult())
		}
	}
	ms.Takeovers = st.GetHa().GetTakeovers()
	ms.Bypass = "off"
	if b := st.GetBypass(); b != nil {
		ms.Bypass, ms.Detections, ms.BypassLag = b.GetState(), b.GetDetections(), b.GetLagSeconds()
	}
	return ms
}

func stateName(s parityv1.ApplierState) string { return client.EnumName(s.String(), "APPLIER_STATE_") }

func resultName(r parityv1.DiffResult) string { return client.EnumName(r.String(), "DIFF_RESULT_") }

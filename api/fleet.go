package api

// fleet.go is the Fleet service (`parity fleet serve`): the fleet's answers (package
// fleet) as the API's messages. A fleet's failure to answer (the fleet file's ownership,
// members that cannot be reached) maps to its code here, as every error of the API does.

import (
	"context"
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/fleet"
)

// fleetServer implements parityv1.FleetServer over a fleet.
type fleetServer struct {
	parityv1.UnimplementedFleetServer
	f *fleet.Fleet
}

// GetFleetStatus implements parityv1.FleetServer.
func (s *fleetServer) GetFleetStatus(ctx context.Context, _ *parityv1.GetFleetStatusRequest) (*parityv1.FleetStatus, error) {
	st := s.f.Status(ctx)
	out := &parityv1.FleetStatus{Fleet: st.Fleet, LagSeconds: st.Lag, WorstMember: st.WorstMember, Unreachable: int32(st.Unreachable)}
	for _, m := range st.Members {
		out.Members = append(out.Members, &parityv1.FleetMemberStatus{Member: m.Member, Addr: m.Addr, Error: m.Error, Instance: m.Instance,
			State: m.State, AppliedTs: m.AppliedTS, AppliedLagSeconds: m.AppliedLag, Verified: m.Verified, FreshnessSeconds: m.Freshness,
			LastRun: m.LastRun, LastResult: m.LastResult, Takeovers: m.Takeovers, Bypass: m.Bypass, BypassDetections: m.Detections,
			BypassLagSeconds: m.BypassLag})
	}
	return out, nil
}

// VerifyFleet implements parityv1.FleetServer.
func (s *fleetServer) VerifyFleet(ctx context.Context, req *parityv1.VerifyFleetRequest) (*parityv1.FleetVerification, error) {
	if req.GetMaxRowsPerSecond() < 0 {
		return nil, fieldErr("max_rows_per_second", "must not be negative, got %d", req.GetMaxRowsPerSecond())
	}
	scope := req.GetScope()
	if scope == "" {
		scope = "full"
	}
	r, err := s.f.Verify(ctx, fleet.VerifyRequest{Scope: scope, MaxRowsPerSecond: req.GetMaxRowsPerSecond()})
	if err != nil {
		return nil, fleetErr(err)
	}
	out := &parityv1.FleetVerification{Fleet: r.Fleet, T: r.T, Attempts: int32(r.Attempts), Result: r.Result,
		Members: memberRuns(r.Members), MaxPause: durationpb.New(r.MaxPause), Took: durationpb.New(r.Took)}
	for _, d := range r.Differences {
		out.Differences = append(out.Differences, &parityv1.FleetDifference{Member: d.Member, Table: d.Table, Key: d.Key, Kind: d.Kind,
			Class: d.Class, Columns: d.Columns})
	}
	return out, nil
}

// FleetCutoverCheck implements parityv1.FleetServer.
func (s *fleetServer) FleetCutoverCheck(ctx context.Context, req *parityv1.FleetCutoverCheckRequest) (*parityv1.FleetCutoverCheckResponse, error) {
	cr := fleet.CutoverRequest{Full: req.GetFull()}
	var err error
	if cr.MaxFullAge, err = positive("max_full_diff_age", req.GetMaxFullDiffAge(), 0); err != nil {
		return nil, err
	}
	if cr.Wait, err = positive("wait_timeout", req.GetWaitTimeout(), 0); err != nil {
		return nil, err
	}
	if cr.FullTables, err = patterns("full_tables", req.GetFullTables()); err != nil {
		return nil, err
	}
	r, err := s.f.CutoverCheck(ctx, cr)
	if err != nil {
		return nil, fleetErr(err)
	}
	return &parityv1.FleetCutoverCheckResponse{Fleet: r.Fleet, Passed: r.Passed, Failures: r.Failures, T: r.T, Attempts: int32(r.Attempts),
		TableOwners: r.Tables, Members: memberRuns(r.Members), MaxPause: durationpb.New(r.MaxPause),
		SlowestMember: durationpb.New(r.Slowest), Took: durationpb.New(r.Took), NoAnswer: r.NoAnswer()}, nil
}

func memberRuns(runs []fleet.MemberRun) []*parityv1.FleetMemberRun {
	var out []*parityv1.FleetMemberRun
	for _, m := range runs {
		out = append(out, &parityv1.FleetMemberRun{Member: m.Member, Addr: m.Addr, RunId: m.RunID, Result: m.Result, Error: m.Error,
			PairTs: m.PairTS, PairPosition: m.PairPosition, Pause: durationpb.New(m.Pause), Tables: m.Tables, KeysVerified: m.Keys,
			Differences: m.Differences, DifferencesByClass: m.ByClass, Failures: m.Failures, Took: durationpb.New(m.Took.Round(time.Microsecond))})
	}
	return out
}

// fleetErr marks a fleet's ownership problem (a table owned by no member or by two) for
// classify: FAILED_PRECONDITION, FLEET_OWNERSHIP.
func fleetErr(err error) error {
	var oe *fleet.OwnershipError
	if errors.As(err, &oe) {
		return &fleetOwnershipError{err}
	}
	return err
}

type fleetOwnershipError struct{ err error }

func (e *fleetOwnershipError) Error() string { return e.err.Error() }
func (e *fleetOwnershipError) Unwrap() error { return e.err }

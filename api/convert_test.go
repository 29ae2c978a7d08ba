package api

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/checker/verify"
)

// TestCountsReachTheAnswer: a run's and a cutover check's counts — differences, their
// classes, and the rows gone when read again at the same pair — are in what the RPCs
// answer, each in its own field.
func TestCountsReachTheAnswer(t *testing.T) {
	rec := verify.RunRecord{RunID: "v1", State: verify.StateDone, Result: verify.ResultDifferent,
		Differences: 2, DifferencesByClass: map[string]int64{"cdc": 2}, Unconfirmed: 3}
	d := diffProto(rec, nil, "i")
	if d.GetDifferences() != 2 || d.GetUnconfirmed() != 3 || d.GetDifferencesByClass()["cdc"] != 2 {
		t.Errorf("Diff: differences %d, unconfirmed %d, classes %v; want 2, 3, cdc:2", d.GetDifferences(), d.GetUnconfirmed(), d.GetDifferencesByClass())
	}
	c := cutoverProto(verify.CutoverResult{Passed: true, RunID: "v2", KeysVerified: 10, ByClass: map[string]int64{}, Unconfirmed: 4})
	if !c.GetPassed() || c.GetKeysVerified() != 10 || c.GetUnconfirmed() != 4 {
		t.Errorf("CutoverCheckResponse: passed %v, keys %d, unconfirmed %d; want true, 10, 4", c.GetPassed(), c.GetKeysVerified(), c.GetUnconfirmed())
	}
}

// TestStatusHA: a daemon's [ha] role, the holder it follows and its lease reach
// GetStatus's ha; without ha.enabled there is none.
func TestStatusHA(t *testing.T) {
	since := time.Date(2026, 11, 25, 14, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		ha   *cdc.HAStatus
		want *parityv1.HAStatus
	}{
		{"without ha", nil, nil},
		{"standby", &cdc.HAStatus{Instance: "b", Role: "standby", Epoch: 3, Holder: "a", LeaseExpiresInSeconds: 7.5, LostReason: "lease lost"},
			&parityv1.HAStatus{Role: parityv1.HARole_HA_ROLE_STANDBY, Holder: "a", Epoch: 3, LeaseExpiresIn: durationpb.New(7500 * time.Millisecond), LostReason: "lease lost"}},
		{"standby, the lease expired", &cdc.HAStatus{Instance: "b", Role: "standby", Epoch: 3, Holder: "a", LeaseExpiresInSeconds: -0.25},
			&parityv1.HAStatus{Role: parityv1.HARole_HA_ROLE_STANDBY, Holder: "a", Epoch: 3, LeaseExpiresIn: durationpb.New(-250 * time.Millisecond)}},
		{"active", &cdc.HAStatus{Instance: "a", Role: "active", Epoch: 4, Holder: "a", LeaseExpiresInSeconds: 10, Takeovers: 2, ActiveSince: since},
			&parityv1.HAStatus{Role: parityv1.HARole_HA_ROLE_ACTIVE, Holder: "a", Epoch: 4, LeaseExpiresIn: durationpb.New(10 * time.Second), Takeovers: 2, ActiveSince: timestamppb.New(since)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := "running"
			if tc.ha != nil && tc.ha.Role == "standby" {
				state = "standby"
			}
			got := statusProto(cdc.Status{Changefeed: "cf", State: state, HA: tc.ha}, nil, "i").GetHa()
			if !proto.Equal(got, tc.want) {
				t.Errorf("ha %v, want %v", got, tc.want)
			}
		})
	}
}

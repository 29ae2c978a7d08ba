package api

import (
	"testing"

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
	c := cutoverProto(CutoverResult{Passed: true, RunID: "v2", KeysVerified: 10, ByClass: map[string]int64{}, Unconfirmed: 4})
	if !c.GetPassed() || c.GetKeysVerified() != 10 || c.GetUnconfirmed() != 4 {
		t.Errorf("CutoverCheckResponse: passed %v, keys %d, unconfirmed %d; want true, 10, 4", c.GetPassed(), c.GetKeysVerified(), c.GetUnconfirmed())
	}
}

package api

// convert.go turns the daemon's values (cdc.Status, verify's records, checker's
// differences, cdc's repair result) into the proto's messages.

import (
	"maps"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/bypass"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/internal/tso"
)

func tsTime(ts uint64) *timestamppb.Timestamp {
	if ts == 0 {
		return nil
	}
	return timestamppb.New(tso.Time(ts))
}

func timeProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

var applierStates = map[string]parityv1.ApplierState{
	"starting": parityv1.ApplierState_APPLIER_STATE_STARTING,
	"running":  parityv1.ApplierState_APPLIER_STATE_RUNNING,
	"stopped":  parityv1.ApplierState_APPLIER_STATE_STOPPED,
	"failed":   parityv1.ApplierState_APPLIER_STATE_FAILED,
	"standby":  parityv1.ApplierState_APPLIER_STATE_STANDBY,
}

var haRoles = map[string]parityv1.HARole{
	"active":  parityv1.HARole_HA_ROLE_ACTIVE,
	"standby": parityv1.HARole_HA_ROLE_STANDBY,
}

func bypassProto(b *bypass.Status) *parityv1.BypassStatus {
	if b == nil {
		return nil
	}
	return &parityv1.BypassStatus{State: b.State, LagSeconds: b.LagSeconds, Detections: b.Detections,
		LastDetectionTime: timeProto(b.LastDetectionTime), WatchedSince: timeProto(b.WatchedSince), LastError: b.LastError}
}

func statusProto(st cdc.Status, vs *verify.Stats, instance string) *parityv1.Status {
	out := &parityv1.Status{
		Changefeed: st.Changefeed, Instance: instance, ApplierState: applierStates[st.State], LastError: st.Error,
		AppliedTs: st.AppliedTs, AppliedTime: tsTime(st.AppliedTs), ResolvedTs: st.ResolvedTs, ResolvedTime: tsTime(st.ResolvedTs),
		AppliedLagSeconds: st.AppliedLagSeconds, ResolvedLagSeconds: st.ResolvedLagSeconds,
		BufferedRows: st.BufferedRows, SpilledRows: st.SpilledRows, RowsApplied: st.RowsApplied, DdlsApplied: st.DDLsApplied,
		DeadLetters: st.DeadLetters, UpdateTime: timeProto(st.UpdatedAt), Verification: &parityv1.VerificationStatus{},
	}
	if out.UpdateTime == nil {
		out.UpdateTime = timestamppb.Now()
	}
	for _, p := range st.Partitions {
		out.Partitions = append(out.Partitions, &parityv1.PartitionStatus{Topic: p.Topic, Partition: int32(p.Partition),
			ResolvedTs: p.ResolvedTs, NextOffset: p.NextOffset, HighWatermark: p.HighWatermark, Lag: p.Lag})
	}
	if ha := st.HA; ha != nil {
		out.Ha = &parityv1.HAStatus{Role: haRoles[ha.Role], Holder: ha.Holder, Epoch: ha.Epoch,
			LeaseExpiresIn: durationpb.New(time.Duration(ha.LeaseExpiresInSeconds * float64(time.Second))),
			Takeovers:      ha.Takeovers, ActiveSince: timeProto(ha.ActiveSince), LostReason: ha.LostReason}
	}
	if vs == nil {
		return out
	}
	v := out.Verification
	v.Enabled, v.Verified, v.CoveredTs, v.CoveredTime, v.CleanDiff, v.LastError = true, vs.Verified, vs.CoveredTS,
		tsTime(vs.CoveredTS), diffName(vs.CleanRunID), vs.LastError
	if vs.Verified {
		v.Freshness = durationpb.New(vs.Freshness)
	}
	for _, a := range vs.Active {
		d := &parityv1.Diff{Name: diffName(a.RunID), RunId: a.RunID, Trigger: a.Trigger, Instance: instance,
			State: parityv1.DiffState_DIFF_STATE_RUNNING}
		if a.Queued {
			d.State = parityv1.DiffState_DIFF_STATE_QUEUED
		}
		d.Progress = progressProto(&a)
		v.Running = append(v.Running, d)
	}
	if vs.LastRun != nil {
		v.LastDiff = diffProto(*vs.LastRun, nil, instance)
	}
	return out
}

var diffStates = map[string]parityv1.DiffState{
	verify.StateRunning:   parityv1.DiffState_DIFF_STATE_RUNNING,
	verify.StateDone:      parityv1.DiffState_DIFF_STATE_DONE,
	verify.StateFailed:    parityv1.DiffState_DIFF_STATE_FAILED,
	verify.StateCancelled: parityv1.DiffState_DIFF_STATE_CANCELLED,
	verify.StateSkipped:   parityv1.DiffState_DIFF_STATE_SKIPPED,
}

// stateName is verify's name of a state runs are listed by ("" for none).
func stateName(s parityv1.DiffState) string {
	for n, v := range diffStates {
		if v == s {
			return n
		}
	}
	return ""
}

var diffResults = map[string]parityv1.DiffResult{
	verify.ResultEqual:     parityv1.DiffResult_DIFF_RESULT_EQUAL,
	verify.ResultDifferent: parityv1.DiffResult_DIFF_RESULT_DIFFERENT,
	verify.ResultFailed:    parityv1.DiffResult_DIFF_RESULT_FAILED,
	verify.ResultCancelled: parityv1.DiffResult_DIFF_RESULT_CANCELLED,
	verify.ResultSkipped:   parityv1.DiffResult_DIFF_RESULT_SKIPPED,
}

func diffProto(r verify.RunRecord, active *verify.ActiveRun, instance string) *parityv1.Diff {
	d := &parityv1.Diff{
		Name: diffName(r.RunID), RunId: r.RunID, Trigger: r.Trigger, TriggerKind: r.TriggerKind, Instance: instance,
		Scope: r.Scope, Tables: r.Patterns, State: diffStates[r.State], Result: diffResults[r.Result],
		CreateTime: timeProto(r.StartedAt), EndTime: timeProto(r.FinishedAt), FirstTs: r.FirstTS, LastTs: r.LastTS,
		MaxPause: durationpb.New(r.MaxPause), TablesCompared: int32(r.TablesCompared), RowsChecked: r.RowsChecked,
		Differences: r.Differences, DifferencesByClass: maps.Clone(r.DifferencesByClass), Error: r.Error,
		Unconfirmed: r.Unconfirmed,
	}
	index := map[int]int32{}
	for i, p := range r.Pairs {
		index[p.Seq] = int32(i)
		pos, src := verify.PositionSource(p.Position)
		d.Pairs = append(d.Pairs, &parityv1.SnapshotPoint{Ts: p.TS, TsTime: tsTime(p.TS), DownstreamPosition: pos,
			PositionSource: src, Pause: durationpb.New(p.Pause), CreateTime: timeProto(p.OpenedAt)})
	}
	for _, t := range r.Tables {
		tr := &parityv1.TableResult{Table: t.Schema + "." + t.Table, Result: t.Result, RowsChecked: t.RowsChecked,
			Differences: t.Differences, Error: t.Error, Scope: t.Scope, ScopeKeys: t.ScopeKeys, Bypass: t.Bypass, BypassKeys: t.BypassKeys, BypassNote: t.BypassNote}
		for _, seq := range t.Pairs {
			if i, ok := index[seq]; ok {
				tr.Pairs = append(tr.Pairs, i)
			}
		}
		d.TableResults = append(d.TableResults, tr)
	}
	if active != nil {
		if active.Queued {
			d.State = parityv1.DiffState_DIFF_STATE_QUEUED
		}
		d.Progress = progressProto(active)
	}
	return d
}

func progressProto(a *verify.ActiveRun) *parityv1.DiffProgress {
	p := &parityv1.DiffProgress{TablesDone: int32(a.TablesDone), TablesTotal: int32(a.Tables), CurrentTable: a.Table,
		ChunksDone: int64(a.ChunksDone), ChunksTotal: int64(a.ChunksTotal), RowsChecked: a.RowsChecked,
		Differences: a.Differences, PairTs: a.PairTS}
	if a.PairAge > 0 {
		p.PairAge = durationpb.New(a.PairAge)
	}
	if a.Queued || a.StartedAt.IsZero() {
		return p
	}
	el := time.Since(a.StartedAt)
	if el <= 0 {
		return p
	}
	p.RowsPerSecond = float64(a.RowsChecked) / el.Seconds()
	// The ETA from what is left: the chunks once the last table's are being cut (before,
	// the total grows as tables are cut), else the tables.
	switch {
	case a.Tables > 0 && a.TablesDone == a.Tables-1 && a.ChunksDone > 0 && a.ChunksTotal > a.ChunksDone:
		p.Eta = durationpb.New(el * time.Duration(a.ChunksTotal-a.ChunksDone) / time.Duration(a.ChunksDone))
	case a.TablesDone > 0 && a.Tables > a.TablesDone:
		p.Eta = durationpb.New(el * time.Duration(a.Tables-a.TablesDone) / time.Duration(a.TablesDone))
	}
	return p
}

var differenceKinds = map[checker.DiffKind]parityv1.DifferenceKind{
	checker.Missing:   parityv1.DifferenceKind_DIFFERENCE_KIND_MISSING,
	checker.Extra:     parityv1.DifferenceKind_DIFFERENCE_KIND_EXTRA,
	checker.Differing: parityv1.DifferenceKind_DIFFERENCE_KIND_DIFFERING,
}

// kindName is checker's kind of k ("" for none).
func kindName(k parityv1.DifferenceKind) checker.DiffKind {
	for n, v := range differenceKinds {
		if v == k {
			return n
		}
	}
	return ""
}

func differenceProto(d checker.StoredDifference) *parityv1.Difference {
	return &parityv1.Difference{Table: d.UpSchema + "." + d.UpTable, Kind: differenceKinds[d.Kind], Class: d.Class, Key: d.Key,
		KeyColumns: d.KeyColumns, Columns: d.Columns, Count: int32(max(d.Count, 1))}
}

func pointProto(p verify.Point) *parityv1.SnapshotPoint {
	pos, src := verify.PositionSource(p.Position)
	if p.Source != "" {
		src = p.Source
	}
	return &parityv1.SnapshotPoint{Ts: p.TS, TsTime: tsTime(p.TS), DownstreamPosition: pos, PositionSource: src,
		Pause: durationpb.New(p.Pause), CreateTime: timeProto(p.CreatedAt)}
}

func repairProto(r RepairResult) *parityv1.RepairResponse {
	out := &parityv1.RepairResponse{DryRun: r.DryRun, Upserted: int64(r.Upserted), Deleted: int64(r.Deleted),
		Unchanged: int64(r.Unchanged), Refused: int64(r.Refused), MaxPause: durationpb.New(r.MaxPause)}
	if !r.DryRun {
		out.RepairId = r.ID
	}
	for _, o := range r.Outcomes {
		out.Keys = append(out.Keys, &parityv1.RepairedKey{Table: o.Key.Schema + "." + o.Key.Table, Key: o.Key.Text,
			Action: string(o.Action), Ts: o.TS, Reason: o.Reason})
	}
	if r.Reverify != nil {
		out.VerifyDiff, out.VerifyResult = diffName(r.Reverify.RunID), diffResults[r.Reverify.Result]
	}
	return out
}

func cutoverProto(r verify.CutoverResult) *parityv1.CutoverCheckResponse {
	out := &parityv1.CutoverCheckResponse{Passed: r.Passed, Failures: r.Failures, UpstreamTs: r.UpstreamTS, Diff: diffName(r.RunID),
		KeysVerified: r.KeysVerified, DifferencesByClass: maps.Clone(r.ByClass), Waited: durationpb.New(r.Waited), Unconfirmed: r.Unconfirmed,
		Bypass: r.Bypass}
	if r.Pair.TS != 0 {
		out.Pair = pointProto(r.Pair)
	}
	for _, t := range r.Tables {
		ct := &parityv1.CutoverTable{Table: t.Table, LastFullDiff: diffName(t.LastFullRunID), SinceTs: t.SinceTS,
			KeysVerified: t.KeysVerified, Differences: t.Differences, Result: t.Result, Full: t.Full,
			LedgerFromTs: t.LedgerFromTS, LedgerUntilTs: t.LedgerUntilTS, LedgerKeys: t.LedgerKeys,
			Bypass: t.Bypass, BypassNote: t.BypassNote, BypassKeys: t.BypassKeys, BypassDdl: t.BypassDDL}
		if t.LastFullRunID != "" {
			ct.LastFullAge = durationpb.New(t.LastFullAge)
		}
		if !t.BypassSince.IsZero() {
			ct.BypassSince = timestamppb.New(t.BypassSince)
		}
		if !t.BypassWatched.IsZero() {
			ct.BypassWatchedSince = timestamppb.New(t.BypassWatched)
		}
		out.Tables = append(out.Tables, ct)
	}
	for i, d := range r.Differences {
		if i == cutoverDiffsMax {
			break
		}
		out.Differences = append(out.Differences, differenceProto(d))
	}
	return out
}

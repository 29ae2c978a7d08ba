package main

import (
	"bytes"
	"errors"
	"flag"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/internal/tso"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/")

// golden compares got with testdata/client/name (rewritten with -update).
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "client", name)
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update to write it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from %s:\n--- got\n%s\n--- want\n%s", t.Name(), path, got, want)
	}
}

var (
	at0   = time.Date(2026, 11, 25, 12, 30, 14, 0, time.UTC)
	ts0   = tso.FromTime(at0) | 7
	tsAt  = func(d time.Duration) uint64 { return tso.FromTime(at0.Add(d)) }
	tstmp = func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(at0.Add(d)) }
)

func runningDiff() *parityv1.Diff {
	return &parityv1.Diff{
		Name: "diffs/v20261125T123014-5d20ec08", RunId: "v20261125T123014-5d20ec08", Trigger: "manual", TriggerKind: "manual",
		Instance: "parity-a", Scope: "full", Tables: []string{"shop.*"}, State: parityv1.DiffState_DIFF_STATE_RUNNING,
		CreateTime: tstmp(0), FirstTs: ts0, LastTs: ts0, RowsChecked: 120000, Differences: 1,
		Progress: &parityv1.DiffProgress{TablesDone: 1, TablesTotal: 4, CurrentTable: "shop.orders", ChunksDone: 30, ChunksTotal: 120,
			RowsChecked: 120000, RowsPerSecond: 40000.4, Differences: 1, Eta: durationpb.New(9*time.Second + 400*time.Millisecond),
			PairTs: ts0, PairAge: durationpb.New(3 * time.Second)},
	}
}

func doneDiff() *parityv1.Diff {
	d := runningDiff()
	d.State, d.Result, d.Progress = parityv1.DiffState_DIFF_STATE_DONE, parityv1.DiffResult_DIFF_RESULT_DIFFERENT, nil
	d.EndTime = tstmp(12*time.Second + 345*time.Millisecond)
	d.LastTs, d.TablesCompared, d.RowsChecked, d.Differences = tsAt(6*time.Second), 2, 480000, 3
	d.MaxPause = durationpb.New(1234 * time.Microsecond)
	d.DifferencesByClass = map[string]int64{"cdc": 2, "diverged": 1}
	d.Pairs = []*parityv1.SnapshotPoint{
		{Ts: ts0, DownstreamPosition: "0-1-1041", PositionSource: "gtid_binlog_pos", Pause: durationpb.New(800 * time.Microsecond)},
		{Ts: tsAt(6 * time.Second), DownstreamPosition: "0-1-1377", PositionSource: "gtid_binlog_pos", Pause: durationpb.New(1234 * time.Microsecond)},
	}
	d.TableResults = []*parityv1.TableResult{
		{Table: "shop.orders", Result: "different", RowsChecked: 400000, Differences: 3, Pairs: []int32{0, 1}},
		{Table: "shop.users", Result: "equal", RowsChecked: 80000, Pairs: []int32{1}},
	}
	return d
}

// The human output of every answer, as a DBA reads it in a runbook's terminal.
func TestClientPrintersGolden(t *testing.T) {
	var b bytes.Buffer
	sec := func(name string) { b.WriteString("== " + name + "\n") }

	sec("status")
	st := &parityv1.Status{Changefeed: "shop", Instance: "parity-a", ApplierState: parityv1.ApplierState_APPLIER_STATE_RUNNING,
		AppliedTs: ts0, AppliedLagSeconds: 0.412, ResolvedTs: tsAt(time.Second), ResolvedLagSeconds: 0.2, BufferedRows: 12, SpilledRows: 0,
		RowsApplied: 81234, DdlsApplied: 3,
		Partitions: []*parityv1.PartitionStatus{{Topic: "cdc-shop", Partition: 0, ResolvedTs: ts0, NextOffset: 100, HighWatermark: 104, Lag: 4}},
		Verification: &parityv1.VerificationStatus{Enabled: true, Verified: true, CoveredTs: ts0, Freshness: durationpb.New(42 * time.Second),
			CleanDiff: "diffs/v1", Running: []*parityv1.Diff{runningDiff()}, LastDiff: doneDiff()}}
	must(t, printAPIStatus(&b, st))
	sec("status, applier failed, verification off")
	must(t, printAPIStatus(&b, &parityv1.Status{Changefeed: "shop", ApplierState: parityv1.ApplierState_APPLIER_STATE_FAILED, LastError: "apply: table shop.t: Error 1146"}))

	sec("wait-applied")
	must(t, printWaitApplied(&b, &parityv1.WaitForAppliedResponse{TargetTs: ts0, AppliedTs: tsAt(time.Second), Waited: durationpb.New(1500 * time.Millisecond)}))
	sec("snapshot")
	must(t, printSnapshotPoint(&b, &parityv1.SnapshotPoint{Ts: ts0, DownstreamPosition: "0-1-1041", PositionSource: "gtid_binlog_pos",
		Pause: durationpb.New(850 * time.Microsecond), CreateTime: tstmp(time.Second)}))

	sec("diff get (running)")
	must(t, printDiff(&b, runningDiff()))
	sec("diff get (done, different)")
	must(t, printDiff(&b, doneDiff()))
	sec("diff get (scoped: cdc, bypass detection off for one table's window)")
	scoped := doneDiff()
	scoped.Scope = "cdc"
	scoped.TableResults = []*parityv1.TableResult{
		{Table: "shop.orders", Result: "different", RowsChecked: 1200, Differences: 3, Pairs: []int32{0}, Scope: "keys", ScopeKeys: 1200, Bypass: "included", BypassKeys: 4},
		{Table: "shop.users", Result: "equal", RowsChecked: 80, Pairs: []int32{1}, Scope: "keys", ScopeKeys: 80, Bypass: "unwatched",
			BypassNote: "the window starts at 2026-11-25T12:30:14Z (TSO 470708339081216007) but bypass detection watched the fallback only from 2026-11-25T12:40:00Z (first start): writes from 2026-11-25T12:30:14Z to 2026-11-25T12:40:00Z were not watched"},
		{Table: "shop.log", Result: "equal", RowsChecked: 5000, Pairs: []int32{1}, Scope: "whole"},
	}
	must(t, printDiff(&b, scoped))
	sec("diff list")
	failed := &parityv1.Diff{RunId: "v2", Trigger: "nightly", Scope: "cdc", State: parityv1.DiffState_DIFF_STATE_FAILED,
		Result: parityv1.DiffResult_DIFF_RESULT_FAILED, CreateTime: tstmp(-time.Hour), EndTime: tstmp(-time.Hour + time.Second), Error: "upstream: TSO past GC"}
	must(t, printDiffList(&b, []*parityv1.Diff{runningDiff(), doneDiff(), failed}))
	sec("diff differences")
	must(t, printDifferences(&b, []*parityv1.Difference{
		{Table: "shop.orders", Kind: parityv1.DifferenceKind_DIFFERENCE_KIND_DIFFERING, Class: "cdc", Key: "id=7", KeyColumns: []string{"id"}, Columns: []string{"total", "note"}, Count: 1},
		{Table: "shop.orders", Kind: parityv1.DifferenceKind_DIFFERENCE_KIND_EXTRA, Class: "diverged", Key: "id=9", KeyColumns: []string{"id"}, Count: 1},
	}, 3))

	sec("cutover-check (failed)")
	must(t, printCutover(&b, &parityv1.CutoverCheckResponse{
		Passed: false, Failures: []string{"shop.orders: 1 difference (diverged 1)", "shop.audit: no clean full run",
			"shop.items: bypass-unwatched: window from TSO 470708339081216007 (…): bypass detection is off: …"}, Bypass: "off",
		UpstreamTs: ts0, Waited: durationpb.New(2 * time.Second),
		Pair: &parityv1.SnapshotPoint{Ts: tsAt(time.Second), DownstreamPosition: "0-1-2000", PositionSource: "gtid_binlog_pos", Pause: durationpb.New(900 * time.Microsecond)},
		Diff: "diffs/c1", KeysVerified: 1234, DifferencesByClass: map[string]int64{"diverged": 1},
		Tables: []*parityv1.CutoverTable{
			{Table: "shop.orders", LastFullDiff: "diffs/v1", LastFullAge: durationpb.New(2 * time.Hour), SinceTs: ts0, KeysVerified: 1234, Differences: 1, Result: "different",
				LedgerKeys: 1234, Bypass: "off"},
			{Table: "shop.audit", Result: "no-full-diff"},
			{Table: "shop.items", LastFullDiff: "diffs/v1", LastFullAge: durationpb.New(2 * time.Hour), SinceTs: ts0, Result: "bypass-unwatched", Bypass: "off"},
		},
		Differences: []*parityv1.Difference{{Table: "shop.orders", Kind: parityv1.DifferenceKind_DIFFERENCE_KIND_MISSING, Class: "diverged", Key: "id=3"}},
	}))
	sec("cutover-check (passed)")
	must(t, printCutover(&b, &parityv1.CutoverCheckResponse{Passed: true, UpstreamTs: ts0, Waited: durationpb.New(0), Bypass: "on",
		Pair: &parityv1.SnapshotPoint{Ts: ts0, DownstreamPosition: "0-1-2000", PositionSource: "gtid_binlog_pos", Pause: durationpb.New(900 * time.Microsecond)},
		Diff: "diffs/c2", KeysVerified: 1300,
		Tables: []*parityv1.CutoverTable{{Table: "shop.orders", LastFullDiff: "diffs/v1", LastFullAge: durationpb.New(2 * time.Hour), SinceTs: ts0, KeysVerified: 1300, Result: "equal",
			LedgerKeys: 1298, Bypass: "included", BypassKeys: 2}, {Table: "shop.audit", KeysVerified: 40, Result: "equal", Full: true}}}))

	sec("repair")
	must(t, printAPIRepair(&b, "diffs/v1", &parityv1.RepairResponse{RepairId: "r1", Upserted: 1, Deleted: 1, Refused: 1,
		MaxPause: durationpb.New(3 * time.Millisecond), VerifyDiff: "diffs/v3", VerifyResult: parityv1.DiffResult_DIFF_RESULT_DIFFERENT,
		Keys: []*parityv1.RepairedKey{{Table: "shop.orders", Key: "id=3", Action: "upsert", Ts: ts0}, {Table: "shop.orders", Key: "id=9", Action: "delete", Ts: ts0},
			{Table: "shop.log", Key: "(no key)", Action: "refused", Ts: ts0, Reason: "the table has no primary or NOT NULL unique key"}}}))
	sec("repair (dry run)")
	must(t, printAPIRepair(&b, "v1", &parityv1.RepairResponse{DryRun: true, Upserted: 1, Keys: []*parityv1.RepairedKey{{Table: "shop.orders", Key: "id=3", Action: "upsert", Ts: ts0}}}))

	sec("progress (plain)")
	p := &diffProgress{w: &b}
	p.update(runningDiff())
	q := runningDiff()
	q.State, q.Progress = parityv1.DiffState_DIFF_STATE_QUEUED, nil
	p.update(q)
	p.update(doneDiff()) // printed by printDiff, not as progress
	golden(t, "printers.golden", b.String())
}

// On a terminal the progress is one line redrawn in place with a bar; it is wiped before
// the result is printed.
func TestDiffProgressTerminal(t *testing.T) {
	var b bytes.Buffer
	p := &diffProgress{w: &b, tty: true}
	p.update(runningDiff())
	got := b.String()
	if !strings.HasPrefix(got, "\r\033[K") || strings.Contains(got, "\n") {
		t.Fatalf("terminal progress is not one line redrawn in place: %q", got)
	}
	// 30 of 120 chunks: a quarter of the bar.
	if want := strings.Repeat("█", 7) + strings.Repeat("░", 23) + "  25%"; !strings.Contains(got, want) {
		t.Errorf("progress %q lacks the bar %q", got, want)
	}
	for _, want := range []string{"chunks 30/120", "tables 1/4 (shop.orders)", "40000 rows/s", "1 differences", "ETA 9s"} {
		if !strings.Contains(got, want) {
			t.Errorf("progress %q lacks %q", got, want)
		}
	}
	b.Reset()
	p.finish()
	if b.String() != "\r\033[K" {
		t.Errorf("finish wrote %q, want the line wiped", b.String())
	}
	// Without chunk totals the bar goes by tables.
	d := runningDiff()
	d.Progress.ChunksTotal = 0
	if f := progressFraction(d.GetProgress()); f != 0.25 {
		t.Errorf("fraction by tables = %v, want 0.25", f)
	}
}

// Exit codes a runbook branches on: 0 equal / passed / nothing to do, 1 differences,
// 2 a run that failed, was cancelled or skipped.
func TestClientExitCodes(t *testing.T) {
	code := func(err error) int {
		if err == nil {
			return 0
		}
		var ee *exitError
		if !errors.As(err, &ee) {
			t.Fatalf("not an exitError: %v", err)
		}
		return ee.code
	}
	for _, c := range []struct {
		state  parityv1.DiffState
		result parityv1.DiffResult
		want   int
	}{
		{parityv1.DiffState_DIFF_STATE_DONE, parityv1.DiffResult_DIFF_RESULT_EQUAL, 0},
		{parityv1.DiffState_DIFF_STATE_DONE, parityv1.DiffResult_DIFF_RESULT_DIFFERENT, 1},
		{parityv1.DiffState_DIFF_STATE_FAILED, parityv1.DiffResult_DIFF_RESULT_FAILED, 2},
		{parityv1.DiffState_DIFF_STATE_CANCELLED, parityv1.DiffResult_DIFF_RESULT_CANCELLED, 2},
		{parityv1.DiffState_DIFF_STATE_SKIPPED, parityv1.DiffResult_DIFF_RESULT_SKIPPED, 2},
		{parityv1.DiffState_DIFF_STATE_RUNNING, parityv1.DiffResult_DIFF_RESULT_UNSPECIFIED, 0},
		{parityv1.DiffState_DIFF_STATE_QUEUED, parityv1.DiffResult_DIFF_RESULT_UNSPECIFIED, 0},
		{parityv1.DiffState_DIFF_STATE_FAILED, parityv1.DiffResult_DIFF_RESULT_UNSPECIFIED, 2},
	} {
		err := diffExit(&parityv1.Diff{RunId: "r", State: c.state, Result: c.result, Error: "boom"})
		if got := code(err); got != c.want {
			t.Errorf("%v/%v: exit %d, want %d", c.state, c.result, got, c.want)
		}
		if c.want == 2 && !strings.Contains(err.Error(), "run r") {
			t.Errorf("%v/%v: error %q does not name the run", c.state, c.result, err)
		}
	}
	keys := []*parityv1.RepairedKey{{Table: "a.b", Key: "id=1", Action: "upsert"}}
	for _, c := range []struct {
		name string
		r    *parityv1.RepairResponse
		want int
	}{
		{"dry run, nothing to do", &parityv1.RepairResponse{DryRun: true, Unchanged: 2}, 0},
		{"dry run, keys to repair", &parityv1.RepairResponse{DryRun: true, Upserted: 1, Keys: keys}, 1},
		{"dry run, refused", &parityv1.RepairResponse{DryRun: true, Refused: 1, Keys: keys}, 1},
		{"repaired, equal again", &parityv1.RepairResponse{Upserted: 1, Keys: keys, VerifyDiff: "diffs/x", VerifyResult: parityv1.DiffResult_DIFF_RESULT_EQUAL}, 0},
		{"repaired, differences remain", &parityv1.RepairResponse{Refused: 1, Keys: keys, VerifyDiff: "diffs/x", VerifyResult: parityv1.DiffResult_DIFF_RESULT_DIFFERENT}, 1},
		{"re-verification failed", &parityv1.RepairResponse{Upserted: 1, Keys: keys, VerifyDiff: "diffs/x", VerifyResult: parityv1.DiffResult_DIFF_RESULT_FAILED}, 2},
		{"nothing to repair", &parityv1.RepairResponse{}, 0},
		{"repaired, not verified", &parityv1.RepairResponse{Upserted: 1, Keys: keys}, 2},
	} {
		if got := code(apiRepairExit(c.r)); got != c.want {
			t.Errorf("%s: exit %d, want %d", c.name, got, c.want)
		}
	}
}

// A failed call is printed with its gRPC code, the ErrorInfo reason and metadata a
// script can grep, then the message.
func TestDescribeCallErr(t *testing.T) {
	st, err := status.New(codes.NotFound, "verification run not found: x").WithDetails(&errdetails.ErrorInfo{
		Reason: parityv1.ErrorReason_DIFF_NOT_FOUND.String(), Domain: "parity.tidb-parity.io", Metadata: map[string]string{"name": "diffs/x", "a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	got := describeCallErr("GetDiff", st.Err())
	if want := "GetDiff: NotFound DIFF_NOT_FOUND (a=b, name=diffs/x): verification run not found: x"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if r := errorReason(st.Err()); r != "DIFF_NOT_FOUND" {
		t.Errorf("errorReason = %q", r)
	}
	if got := describeCallErr("GetStatus", status.Error(codes.PermissionDenied, "role read")); got != "GetStatus: PermissionDenied: role read" {
		t.Errorf("without details: %q", got)
	}
	var ee *exitError
	if err := callErr("X", st.Err()); !errors.As(err, &ee) || ee.code != 2 {
		t.Errorf("callErr = %v, want exit 2", err)
	}
}

// The connection flags: the token file holds one token, which is never sent in clear
// beyond loopback; TLS files are checked; --addr defaults from the environment.
func TestClientFlags(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, empty, two := write("good", "s3cr3t-token\n"), write("empty", "\n"), write("two", "a\nb\n")
	if tok, err := client.ReadTokenFile(good); err != nil || tok != "s3cr3t-token" {
		t.Errorf("ReadTokenFile = %q, %v", tok, err)
	}
	for _, p := range []string{empty, two, filepath.Join(dir, "none")} {
		f := clientFlags{addr: "127.0.0.1:1", tokenFile: p}
		if _, _, err := f.dial(); err == nil || !strings.Contains(err.Error(), "--token-file") {
			t.Errorf("dial with --token-file %s = %v, want an error naming --token-file", p, err)
		}
	}
	if _, _, err := (&clientFlags{addr: "10.1.2.3:1", tokenFile: good}).dial(); err == nil || !strings.Contains(err.Error(), "in clear") {
		t.Errorf("a token in clear to 10.1.2.3: %v, want it refused", err)
	}
	md, _ := client.Bearer{Token: "s3cr3t-token"}.GetRequestMetadata(t.Context())
	if md["authorization"] != "Bearer s3cr3t-token" {
		t.Errorf("metadata %v", md)
	}

	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"token in clear beyond loopback", []string{"--addr", "10.1.2.3:8391", "--token-file", good}, "in clear"},
		{"cert without key", []string{"--tls-cert", good}, "needs both its certificate and its key"},
		{"CA that is no PEM", []string{"--tls-ca", good}, "no PEM certificate"},
		{"bad addr", []string{"--addr", "nohostport"}, "--addr: want host:port"},
		{"empty token file", []string{"--token-file", empty}, "empty"},
	} {
		code, _, errs := runCLI(t, append([]string{"diff", "get", "x"}, c.args...)...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and %q", c.name, code, errs, c.want)
		}
	}

	// A daemon that is not there: exit 2 with the gRPC code.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	code, _, errs := runCLI(t, "wait-applied", "--now", "--addr", addr, "--timeout", "5s")
	if code != 2 || !strings.Contains(errs, "WaitForApplied: Unavailable") {
		t.Errorf("no daemon: exit %d, stderr %q", code, errs)
	}
	t.Setenv(envAPIAddr, addr)
	code, _, errs = runCLI(t, "cutover-check", "--now", "--timeout", "5s")
	if code != 2 || !strings.Contains(errs, addr) {
		t.Errorf("%s from the environment: exit %d, stderr %q", envAPIAddr, code, errs)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"wait-applied"}, "--ts or --now"},
		{[]string{"wait-applied", "--now", "--ts", "1"}, "give one"},
		{[]string{"wait-applied", "--ts", "abc"}, "want a TiDB TSO"},
		{[]string{"cutover-check"}, "--ts or --now"},
		{[]string{"snapshot", "--at", "0"}, "--at"},
		{[]string{"diff", "list", "--state", "bogus"}, "want one of cancelled, done, failed, queued, running, skipped"},
		{[]string{"diff", "list", "--after", "yesterday"}, "--after"},
		{[]string{"diff", "differences", "r", "--kind", "odd"}, "want one of differing, extra, missing"},
		{[]string{"diff", "start", "--max-rows-per-second", "-1"}, "--max-rows-per-second"},
	} {
		code, _, errs := runCLI(t, c.args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 and %q", c.args, code, errs, c.want)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

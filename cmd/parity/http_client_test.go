package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/daemon"
)

// http_client_test.go: the tests' clients of the daemon's HTTP endpoints (/status,
// /verify/run, /verify/runs, /repair), which stay beside the gRPC API; the CLI calls the
// API (client*.go).

func fetchStatus(ctx context.Context, addr string) (daemon.Status, []byte, error) {
	var st daemon.Status
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	if err != nil {
		return st, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, nil, fmt.Errorf("reading status from %s: %w", addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return st, nil, fmt.Errorf("reading status from %s: %w", addr, err)
	}
	if resp.StatusCode != http.StatusOK {
		return st, nil, fmt.Errorf("reading status from %s: HTTP %s", addr, resp.Status)
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, nil, fmt.Errorf("decoding status from %s: %w", addr, err)
	}
	return st, raw, nil
}

func printStatus(w io.Writer, full daemon.Status) error {
	st := full.Status
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	ts := func(v uint64, t time.Time) string {
		if v == 0 {
			return "0"
		}
		return fmt.Sprintf("%d (%s)", v, t.UTC().Format("2006-01-02 15:04:05.000 UTC"))
	}
	fmt.Fprintf(tw, "changefeed:\t%s\n", st.Changefeed)
	fmt.Fprintf(tw, "state:\t%s\n", st.State)
	if st.Error != "" {
		fmt.Fprintf(tw, "error:\t%s\n", st.Error)
	}
	fmt.Fprintf(tw, "applied checkpoint ts:\t%s\n", ts(st.AppliedTs, st.AppliedTime))
	fmt.Fprintf(tw, "applied lag:\t%.3fs\n", st.AppliedLagSeconds)
	fmt.Fprintf(tw, "global resolved ts:\t%s\n", ts(st.ResolvedTs, st.ResolvedTime))
	fmt.Fprintf(tw, "resolved lag:\t%.3fs\n", st.ResolvedLagSeconds)
	printVerifyStatus(tw, full.Verify)
	fmt.Fprintf(tw, "buffered rows:\t%d (%d spilled, ~%d bytes in memory)\n", st.BufferedRows, st.SpilledRows, st.BufferedBytes)
	fmt.Fprintf(tw, "pending DDLs:\t%d\n", st.PendingDDLs)
	fmt.Fprintf(tw, "applied since start:\t%d rows, %d DDLs\n", st.RowsApplied, st.DDLsApplied)
	fmt.Fprintf(tw, "dead letters since start:\t%d\n", st.DeadLetters)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tRESOLVED TS\tNEXT OFFSET\tCHECKPOINT OFFSET\tHIGH WATERMARK\tKAFKA LAG")
	for _, p := range st.Partitions {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Topic, p.Partition, p.ResolvedTs, p.NextOffset, p.CheckpointOffset, p.HighWatermark, p.Lag)
	}
	return tw.Flush()
}

// printVerifyStatus prints verification's lines, next to the replication lag.
func printVerifyStatus(tw io.Writer, v *daemon.VerifyStatus) {
	if v == nil {
		fmt.Fprintf(tw, "verification:\toff (verify.enabled)\n")
		return
	}
	switch {
	case v.FreshnessSeconds == nil:
		fmt.Fprintf(tw, "verification freshness:\tnever verified clean\n")
	default:
		fmt.Fprintf(tw, "verification freshness:\t%.3fs (changes up to %s verified by run %s)\n", *v.FreshnessSeconds, fmtTS(v.CoveredTs), v.CleanRunID)
	}
	running := fmt.Sprintf("%d running", v.Running)
	for _, a := range v.Active {
		if a.Queued {
			running += fmt.Sprintf("; %s (%s) waiting", a.RunID, a.Trigger)
			continue
		}
		running += fmt.Sprintf("; %s (%s) table %d/%d %s, %d rows", a.RunID, a.Trigger, a.TablesDone, a.Tables, a.Table, a.RowsChecked)
	}
	fmt.Fprintf(tw, "verification runs:\t%s\n", running)
	if v.Instance != "" {
		fmt.Fprintf(tw, "verification instance:\t%s\n", v.Instance)
	}
	if r := v.LastRun; r != nil {
		note := ""
		if r.Error != "" {
			note = ": " + r.Error
		}
		fmt.Fprintf(tw, "last verification:\t%s (%s) %s, %d rows, %d differences, ended %s%s\n", r.RunID, r.Trigger, r.Result,
			r.RowsChecked, r.Differences, r.FinishedAt.UTC().Format("2006-01-02 15:04:05 UTC"), note)
	}
	if v.PauseCount > 0 {
		fmt.Fprintf(tw, "snapshot pairs:\t%d (mean pause %v, %d view rotations)\n", v.Pairs,
			time.Duration(v.PauseSum/float64(v.PauseCount)*float64(time.Second)).Round(time.Microsecond), v.Rotations)
	}
	if v.LastError != "" {
		fmt.Fprintf(tw, "verification problem:\t%s\n", v.LastError)
	}
}

// verifyCall calls a verification endpoint and returns the body of a 2xx answer.
func verifyCall(ctx context.Context, method, addr, path string) ([]byte, int, error) {
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("calling parity serve at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, 0, fmt.Errorf("calling parity serve at %s: %w", addr, err)
	}
	if resp.StatusCode/100 != 2 {
		var e daemon.VerifyError
		if json.Unmarshal(raw, &e) == nil && e.Error != "" {
			return nil, resp.StatusCode, fmt.Errorf("parity serve at %s: %s", addr, e.Error)
		}
		if resp.StatusCode == http.StatusNotFound {
			return nil, resp.StatusCode, fmt.Errorf("parity serve at %s has no verification endpoints: is verify.enabled set?", addr)
		}
		return nil, resp.StatusCode, fmt.Errorf("parity serve at %s: HTTP %s: %s", addr, resp.Status, bytes.TrimSpace(raw))
	}
	return raw, resp.StatusCode, nil
}

// repairExit is the exit status of a repair's response (see the command's help).
func repairExit(resp daemon.RepairResult) error {
	if resp.DryRun {
		if resp.Upserted+resp.Deleted+resp.Refused > 0 {
			return &exitError{code: 1}
		}
		return nil
	}
	if resp.Reverify == nil {
		if len(resp.Outcomes) == 0 {
			return nil // nothing to repair
		}
		return &exitError{code: 2, err: errors.New("the repaired tables were not verified again")}
	}
	switch resp.Reverify.Result {
	case verify.ResultEqual:
		return nil
	case verify.ResultDifferent:
		return &exitError{code: 1}
	}
	return &exitError{code: 2, err: fmt.Errorf("re-verification run %s %s: %s", resp.Reverify.RunID, resp.Reverify.Result, resp.Reverify.Error)}
}

// runRepairHTTP asks POST /repair with `parity repair`'s flags of before the API (--run,
// --table, --dry-run) and returns what that command did: its exit status, the JSON
// answer, and the error.
func runRepairHTTP(t *testing.T, addr string, args ...string) (int, string, string) {
	t.Helper()
	v := url.Values{}
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--run":
			i++
			v.Set("run", args[i])
		case "--table":
			i++
			v.Add("table", args[i])
		case "--dry-run":
			v.Set("dry-run", "1")
		default:
			t.Fatalf("runRepairHTTP: unknown flag %s", args[i])
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	raw, _, err := verifyCall(ctx, http.MethodPost, addr, "/repair?"+v.Encode())
	if err != nil {
		return 2, "", err.Error()
	}
	var resp daemon.RepairResult
	if err := json.Unmarshal(raw, &resp); err != nil {
		t.Fatalf("POST /repair: %v\n%s", err, raw)
	}
	var ee *exitError
	if err := repairExit(resp); errors.As(err, &ee) {
		msg := ""
		if ee.err != nil {
			msg = ee.err.Error()
		}
		return ee.code, string(raw), msg
	}
	return 0, string(raw), ""
}

// runVerifyHTTP asks POST /verify/run?wait=true with `parity verify`'s flags of before
// the API (--scope, --table) and returns what that command did: its exit status (0
// equal, 1 different, 2 otherwise), the run's JSON, and the error.
func runVerifyHTTP(t *testing.T, addr string, args ...string) (int, string, string) {
	t.Helper()
	v := url.Values{"wait": {"true"}}
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--scope":
			i++
			v.Set("scope", args[i])
		case "--table":
			i++
			v.Add("table", args[i])
		default:
			t.Fatalf("runVerifyHTTP: unknown flag %s", args[i])
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	raw, _, err := verifyCall(ctx, http.MethodPost, addr, "/verify/run?"+v.Encode())
	if err != nil {
		return 2, "", err.Error()
	}
	var rec verify.RunRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatalf("POST /verify/run: %v\n%s", err, raw)
	}
	switch rec.Result {
	case verify.ResultEqual:
		return 0, string(raw), ""
	case verify.ResultDifferent:
		return 1, string(raw), ""
	}
	return 2, string(raw), fmt.Sprintf("run %s %s: %s", rec.RunID, rec.Result, rec.Error)
}

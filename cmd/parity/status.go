package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func init() {
	addCommand(func() *cobra.Command {
		var addr string
		var asJSON bool
		var timeout time.Duration
		cmd := &cobra.Command{
			Use:   "status",
			Short: "Print the applied checkpoint, resolved ts, lag, Kafka lag and verification freshness of a running `parity serve`",
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				defer cancel()
				st, raw, err := fetchStatus(ctx, addr)
				if err != nil {
					return &exitError{code: 2, err: err}
				}
				if asJSON {
					_, err = cmd.OutOrStdout().Write(raw)
					return err
				}
				return printStatus(cmd.OutOrStdout(), st)
			},
		}
		cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8390", "status address of parity serve (status.addr)")
		cmd.Flags().BoolVar(&asJSON, "json", false, "print the raw JSON status")
		cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "request timeout")
		return cmd
	})
}

func fetchStatus(ctx context.Context, addr string) (serveStatus, []byte, error) {
	var st serveStatus
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

func printStatus(w io.Writer, full serveStatus) error {
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
func printVerifyStatus(tw io.Writer, v *verifyStatus) {
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

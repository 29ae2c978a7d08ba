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

	"github.com/tidb-parity/parity/cdc"
)

func init() {
	addCommand(func() *cobra.Command {
		var addr string
		var asJSON bool
		var timeout time.Duration
		cmd := &cobra.Command{
			Use:   "status",
			Short: "Print the applied checkpoint, resolved ts, lag and Kafka lag of a running `parity serve`",
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

func fetchStatus(ctx context.Context, addr string) (cdc.Status, []byte, error) {
	var st cdc.Status
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

func printStatus(w io.Writer, st cdc.Status) error {
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

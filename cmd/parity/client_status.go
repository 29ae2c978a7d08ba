package main

// client_status.go: `parity status`, `parity wait-applied` and `parity snapshot` over the
// gRPC API (GetStatus/WatchStatus, WaitForApplied, CreateSnapshotPoint).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

func init() {
	addCommand(newStatusCommand)
	addCommand(newWaitAppliedCommand)
	addCommand(newSnapshotCommand)
}

func newStatusCommand() *cobra.Command {
	var (
		cf       clientFlags
		watch    bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Print the applied checkpoint, resolved ts, lag, Kafka lag and verification freshness of a running `parity serve`",
		Long: `status asks a running parity serve (its gRPC API, api.addr) for replication and
verification progress. --watch prints it again every --interval until interrupted
(SIGINT or SIGTERM ends it with exit status 0), or for --timeout when that is given;
each update must arrive within the interval plus 10s, else the watch fails.

Exit status: 0 when the applier is running (with --watch: watched until interrupted or
--timeout), 1 when it is not (starting, stopped or failed: the state and last error
are printed; a standby under [ha]: its role and the daemon it follows are printed), 2 on
error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if watch {
				return watchStatus(cmd, &cf, interval, cmd.Flags().Changed("timeout"))
			}
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				st, err := c.GetStatus(ctx, &parityv1.GetStatusRequest{})
				if err != nil {
					return callErr("GetStatus", err)
				}
				if err := printAnswer(cmd, &cf, st, printAPIStatus); err != nil {
					return err
				}
				if st.GetApplierState() != parityv1.ApplierState_APPLIER_STATE_RUNNING {
					return &exitError{code: exitNotClean}
				}
				return nil
			})
		},
	}
	cf.register(cmd.Flags(), 10*time.Second)
	cmd.Flags().BoolVar(&watch, "watch", false, "print the status again every --interval until interrupted (or for --timeout when given)")
	cmd.Flags().DurationVar(&interval, "interval", 0, "with --watch: how often (1s to 5m; default 5s)")
	cmd.Flags().Lookup("timeout").Usage = "give up after this long (0: never); with --watch, how long to watch (default: until interrupted)"
	return cmd
}

// statusUpdateTimeout is how much longer than its interval a watched status update may
// take before the watch fails (the daemon stopped answering, or the network did).
const statusUpdateTimeout = 10 * time.Second

// errNoUpdate ends a watch whose next update did not arrive in time.
var errNoUpdate = errors.New("no status update")

// watchStatus prints the status at once and every interval (the daemon's WatchStatus
// stream) until SIGINT or SIGTERM (exit 0), the daemon ends the stream (it stops: exit
// 0), or, when bounded (--timeout given), --timeout has passed (exit 0). Each update
// must arrive within the interval plus statusUpdateTimeout.
func watchStatus(cmd *cobra.Command, cf *clientFlags, interval time.Duration, bounded bool) error {
	conn, c, err := cf.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx := cmd.Context()
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if bounded && cf.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cf.timeout)
		defer cancel()
	}
	every := interval
	if every <= 0 {
		every = 5 * time.Second // the daemon's default
	}
	wait := every + statusUpdateTimeout
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watchdog := time.AfterFunc(wait, func() {
		cancel(fmt.Errorf("%w from %s within %v (the interval plus %v)", errNoUpdate, cf.addr, wait, statusUpdateTimeout))
	})
	defer watchdog.Stop()
	ended := func(err error) error {
		if cause := context.Cause(sctx); errors.Is(cause, errNoUpdate) {
			return &exitError{code: exitNoAnswer, err: fmt.Errorf("WatchStatus: %w", cause)}
		}
		if ctx.Err() != nil || errors.Is(err, io.EOF) {
			return nil // interrupted, --timeout passed, or the daemon stopped
		}
		// --timeout passed, and the daemon, which was given the same deadline, ended
		// the stream first: gRPC reports that as DeadlineExceeded as soon as the
		// deadline is past, before ctx's own timer has marked ctx done.
		if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
			return nil
		}
		return callErr("WatchStatus", err)
	}
	stream, err := c.WatchStatus(sctx, &parityv1.WatchStatusRequest{Interval: durOrNil(interval)})
	if err != nil {
		return ended(err)
	}
	out := cmd.OutOrStdout()
	for {
		st, err := stream.Recv()
		if err != nil {
			return ended(err)
		}
		watchdog.Reset(wait)
		if cf.json {
			err = printJSONLine(out, st)
		} else {
			err = printAPIStatus(out, st)
			fmt.Fprintln(out)
		}
		if err != nil {
			return err
		}
	}
}

// applierStateName is the state without its enum prefix: running, failed, ...
func applierStateName(s parityv1.ApplierState) string {
	return client.EnumName(s.String(), "APPLIER_STATE_")
}

func printAPIStatus(w io.Writer, st *parityv1.Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "changefeed:\t%s\n", st.GetChangefeed())
	if st.GetInstance() != "" {
		fmt.Fprintf(tw, "instance:\t%s\n", st.GetInstance())
	}
	fmt.Fprintf(tw, "applier:\t%s\n", applierStateName(st.GetApplierState()))
	printAPIHA(tw, st.GetHa())
	if st.GetLastError() != "" {
		fmt.Fprintf(tw, "error:\t%s\n", st.GetLastError())
	}
	fmt.Fprintf(tw, "applied checkpoint ts:\t%s\n", fmtTS(st.GetAppliedTs()))
	fmt.Fprintf(tw, "applied lag:\t%.3fs\n", st.GetAppliedLagSeconds())
	fmt.Fprintf(tw, "global resolved ts:\t%s\n", fmtTS(st.GetResolvedTs()))
	fmt.Fprintf(tw, "resolved lag:\t%.3fs\n", st.GetResolvedLagSeconds())
	printAPIVerification(tw, st.GetVerification())
	fmt.Fprintf(tw, "buffered rows:\t%d (%d spilled)\n", st.GetBufferedRows(), st.GetSpilledRows())
	fmt.Fprintf(tw, "applied since start:\t%d rows, %d DDLs\n", st.GetRowsApplied(), st.GetDdlsApplied())
	fmt.Fprintf(tw, "dead letters since start:\t%d\n", st.GetDeadLetters())
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.GetPartitions()) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tRESOLVED TS\tNEXT OFFSET\tHIGH WATERMARK\tKAFKA LAG")
	for _, p := range st.GetPartitions() {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", p.GetTopic(), p.GetPartition(), p.GetResolvedTs(), p.GetNextOffset(), p.GetHighWatermark(), p.GetLag())
	}
	return tw.Flush()
}

// printAPIHA prints a daemon's [ha] role: the holder a standby follows, an active
// daemon's epoch; nothing without ha.
func printAPIHA(tw io.Writer, ha *parityv1.HAStatus) {
	if ha == nil {
		return
	}
	role := strings.ToLower(strings.TrimPrefix(ha.GetRole().String(), "HA_ROLE_"))
	switch ha.GetRole() {
	case parityv1.HARole_HA_ROLE_ACTIVE:
		fmt.Fprintf(tw, "ha role:\t%s (holds the lease at epoch %d since %s, %d takeovers)\n", role, ha.GetEpoch(), fmtTime(ha.GetActiveSince()), ha.GetTakeovers())
	default:
		holder := ha.GetHolder()
		if holder == "" {
			holder = "no daemon"
		}
		lease := "expires in " + fmtDur(ha.GetLeaseExpiresIn())
		if d := ha.GetLeaseExpiresIn(); d != nil && d.AsDuration() < 0 {
			lease = "expired " + fmtDur(durationpb.New(-d.AsDuration())) + " ago"
		}
		fmt.Fprintf(tw, "ha role:\t%s (follows %s, lease epoch %d %s)\n", role, holder, ha.GetEpoch(), lease)
	}
	if ha.GetLostReason() != "" {
		fmt.Fprintf(tw, "ha last lost:\t%s\n", ha.GetLostReason())
	}
}

func printAPIVerification(tw io.Writer, v *parityv1.VerificationStatus) {
	if !v.GetEnabled() {
		fmt.Fprintf(tw, "verification:\toff (verify.enabled)\n")
		return
	}
	if v.GetVerified() {
		fmt.Fprintf(tw, "verification freshness:\t%s (changes up to %s verified by %s)\n", fmtDur(v.GetFreshness()), fmtTS(v.GetCoveredTs()), runIDOf(v.GetCleanDiff()))
	} else {
		fmt.Fprintf(tw, "verification freshness:\tnever verified clean\n")
	}
	running := fmt.Sprintf("%d running", len(v.GetRunning()))
	for _, d := range v.GetRunning() {
		running += "; " + d.GetRunId() + " (" + d.GetTrigger() + ") " + diffStateName(d.GetState())
		if p := d.GetProgress(); p != nil && d.GetState() == parityv1.DiffState_DIFF_STATE_RUNNING {
			running += fmt.Sprintf(" table %d/%d %s, %d rows", p.GetTablesDone(), p.GetTablesTotal(), p.GetCurrentTable(), p.GetRowsChecked())
		}
	}
	fmt.Fprintf(tw, "verification runs:\t%s\n", running)
	if d := v.GetLastDiff(); d != nil {
		note := ""
		if d.GetError() != "" {
			note = ": " + d.GetError()
		}
		fmt.Fprintf(tw, "last verification:\t%s (%s) %s, %d rows, %d differences, ended %s%s\n", d.GetRunId(), d.GetTrigger(),
			diffResultName(d.GetResult()), d.GetRowsChecked(), d.GetDifferences(), fmtTime(d.GetEndTime()), note)
	}
	if v.GetLastError() != "" {
		fmt.Fprintf(tw, "verification problem:\t%s\n", v.GetLastError())
	}
}

func newWaitAppliedCommand() *cobra.Command {
	var (
		cf    clientFlags
		tsArg string
		now   bool
	)
	cmd := &cobra.Command{
		Use:   "wait-applied (--ts TSO | --now)",
		Short: "Wait until a running `parity serve` has applied a TSO to the fallback",
		Long: `wait-applied returns once the daemon's applier has applied the TSO: every change
TiDB committed at or before it is in the fallback. --now waits for the upstream's
current TSO, read from TiDB when the call arrives: with writes to the upstream
stopped, that is the quiescent point of a cutover.

Exit status: 0 applied, 1 not applied within --timeout, 2 on error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &parityv1.WaitForAppliedRequest{}
			switch {
			case now && tsArg != "":
				return usageErr(errors.New("--ts and --now: give one"))
			case now:
				req.Target = &parityv1.WaitForAppliedRequest_Now{Now: true}
			case tsArg != "":
				ts, err := strconv.ParseUint(tsArg, 10, 64)
				if err != nil || ts == 0 {
					return usageErr(fmt.Errorf("--ts: want a TiDB TSO, got %q", tsArg))
				}
				req.Target = &parityv1.WaitForAppliedRequest_Ts{Ts: ts}
			default:
				return usageErr(errors.New("--ts or --now: the TSO to wait for is required"))
			}
			req.Timeout = durOrNil(cf.timeout)
			// The server answers a wait that ran out (DEADLINE) before this deadline.
			return cf.call(cmd, 5*time.Second, func(ctx context.Context, c parityv1.ParityClient) error {
				resp, err := c.WaitForApplied(ctx, req)
				if status.Code(err) == codes.DeadlineExceeded {
					fmt.Fprintf(cmd.ErrOrStderr(), "parity: %s\n", describeCallErr("WaitForApplied", err))
					return &exitError{code: exitNotClean}
				}
				if err != nil {
					return callErr("WaitForApplied", err)
				}
				return printAnswer(cmd, &cf, resp, printWaitApplied)
			})
		},
	}
	cf.register(cmd.Flags(), 10*time.Minute)
	cmd.Flags().StringVar(&tsArg, "ts", "", "the TiDB TSO to wait for")
	cmd.Flags().BoolVar(&now, "now", false, "wait for the upstream's current TSO (the quiescent point once writes are stopped)")
	cmd.Flags().Lookup("timeout").Usage = "how long to wait (0: the daemon's default, 10m)"
	return cmd
}

func printWaitApplied(w io.Writer, r *parityv1.WaitForAppliedResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "applied:\tyes\n")
	fmt.Fprintf(tw, "target ts:\t%s\n", fmtTS(r.GetTargetTs()))
	fmt.Fprintf(tw, "applied ts:\t%s\n", fmtTS(r.GetAppliedTs()))
	fmt.Fprintf(tw, "waited:\t%s\n", fmtDur(r.GetWaited()))
	return tw.Flush()
}

func newSnapshotCommand() *cobra.Command {
	var (
		cf clientFlags
		at uint64
	)
	cmd := &cobra.Command{
		Use:   "snapshot [--at TSO]",
		Short: "Create a snapshot point: the fallback held exactly at a TSO, its position recorded",
		Long: `snapshot asks a running parity serve to hold the fallback exactly at a TSO the
changefeed has resolved (default: the global resolved ts), record the fallback's
position there (GTID or binlog position) in the ts-map and release it. The pair (TiDB
at the TSO, the fallback at the position) aligns the two sides for other tools.

Exit status: 0 created, 2 on error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &parityv1.CreateSnapshotPointRequest{}
			if cmd.Flags().Changed("at") {
				if at == 0 {
					return usageErr(errors.New("--at: want a TiDB TSO, got 0"))
				}
				req.AtTs = proto.Uint64(at)
			}
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				p, err := c.CreateSnapshotPoint(ctx, req)
				if err != nil {
					return callErr("CreateSnapshotPoint", err)
				}
				return printAnswer(cmd, &cf, p, printSnapshotPoint)
			})
		},
	}
	cf.register(cmd.Flags(), 2*time.Minute)
	cmd.Flags().Uint64Var(&at, "at", 0, "the TSO to hold the fallback at (not applied yet; default: the global resolved ts)")
	return cmd
}

func printSnapshotPoint(w io.Writer, p *parityv1.SnapshotPoint) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "upstream ts:\t%s\n", fmtTS(p.GetTs()))
	fmt.Fprintf(tw, "downstream position:\t%s (%s)\n", p.GetDownstreamPosition(), p.GetPositionSource())
	fmt.Fprintf(tw, "replication paused:\t%s\n", fmtDur(p.GetPause()))
	fmt.Fprintf(tw, "created:\t%s\n", fmtTime(p.GetCreateTime()))
	return tw.Flush()
}

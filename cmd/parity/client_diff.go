package main

// client_diff.go: `parity diff start|get|watch|cancel|list|differences|fix-sql`, the
// daemon's verification runs over the gRPC API, and `parity verify`, kept as the
// shorthand of `parity diff start --watch`. `parity diff` itself (with --upstream and
// --downstream, diff.go) still compares two servers on its own.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

// newDiffAPICommands are parity diff's subcommands that call a running daemon.
func newDiffAPICommands() []*cobra.Command {
	return []*cobra.Command{
		newDiffStartCommand("start", false), newDiffGetCommand(), newDiffWatchCommand(), newDiffCancelCommand(),
		newDiffListCommand(), newDiffDifferencesCommand(), newDiffFixSQLCommand(),
	}
}

func init() {
	addCommand(func() *cobra.Command { return newDiffStartCommand("verify", true) })
}

const diffExitHelp = `Exit status: 0 equal (or, without waiting, started), 1 differences found, 2 when the
run has no verdict (it failed, was cancelled or skipped) or on error (README.md, "Exit
status").`

// newDiffStartCommand is `parity diff start`, and as `parity verify` the same command
// watching the run by default (--no-wait returns once it started).
func newDiffStartCommand(use string, verifyAlias bool) *cobra.Command {
	var (
		cf         clientFlags
		scope      string
		tables     []string
		maxViewAge time.Duration
		minTS      uint64
		maxRate    int64
		watch      bool
		noWait     bool
		interval   time.Duration
	)
	cmd := &cobra.Command{
		Use:   use,
		Short: "Start a verification run on a running `parity serve` (verify.enabled)",
		Long: `Start a manual verification run on a running parity serve, at snapshot pairs (TiDB
read at a TSO, the fallback held exactly there) taken without stopping replication.
--watch follows it to the end with a live progress line (plain lines when stdout is
not a terminal) and prints the result.

` + diffExitHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &parityv1.StartDiffRequest{Scope: scope, Tables: tables}
			if maxViewAge > 0 || minTS > 0 {
				req.SnapshotPolicy = &parityv1.SnapshotPolicy{MaxViewAge: durOrNil(maxViewAge), MinTs: minTS}
			}
			if maxRate < 0 {
				return usageErr(fmt.Errorf("--max-rows-per-second: want 0 or more, got %d", maxRate))
			}
			if maxRate > 0 {
				req.Options = &parityv1.DiffOptions{MaxRowsPerSecond: maxRate}
			}
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				d, err := c.StartDiff(ctx, req)
				if err != nil {
					return callErr("StartDiff", err)
				}
				if verifyAlias {
					watch = !noWait
				}
				out := cmd.OutOrStdout()
				if !watch {
					if cf.json {
						return printJSON(out, d)
					}
					fmt.Fprintf(out, "started %s (%s, scope %s over %s)\n", d.GetName(), diffStateName(d.GetState()), d.GetScope(), strings.Join(d.GetTables(), ", "))
					return nil
				}
				if !cf.json {
					fmt.Fprintf(cmd.ErrOrStderr(), "started %s\n", d.GetName())
				}
				final, err := watchDiff(cmd, c, &cf, d.GetName(), interval)
				if err != nil {
					return err
				}
				return diffExit(final)
			})
		},
	}
	fl := cmd.Flags()
	cf.register(fl, 0)
	fl.StringVar(&scope, "scope", "", "full, cdc (keys changed since each table's last clean verification) or since:<TSO|RFC 3339 time> (default: verify.scope)")
	fl.StringArrayVar(&tables, "table", nil, "schema.table pattern to verify, * and ? wildcards (repeatable; default: verify.tables)")
	fl.DurationVar(&maxViewAge, "max-view-age", 0, "take a fresh snapshot pair once a pair's read view is this old (at most verify.max-view-age; default it)")
	fl.Uint64Var(&minTS, "min-ts", 0, "take the first snapshot pair at or after this TSO (default: the resolved ts when the run starts)")
	fl.Int64Var(&maxRate, "max-rows-per-second", 0, "upstream rows per second the run may read, below verify's cap (0: the cap)")
	fl.DurationVar(&interval, "interval", 0, "how often the progress is updated while watching (default: 500ms on a terminal, 5s otherwise)")
	if verifyAlias {
		cmd.Short = "Run a verification on a running `parity serve` and wait for its result (parity diff start --watch)"
		fl.BoolVar(&noWait, "no-wait", false, "print the run and return once it started")
		history := newDiffListCommand()
		history.Use = "history"
		history.Short = "List a running `parity serve`'s verification runs, newest first (parity diff list)"
		cmd.AddCommand(history)
	} else {
		fl.BoolVar(&watch, "watch", false, "follow the run to its end, then print it and exit by its result")
	}
	return cmd
}

func newDiffGetCommand() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "get RUN",
		Short: "Print a verification run of a running `parity serve` (its progress while it runs)",
		Long:  "get prints a run: its pairs, tables, differences by class, or its progress.\n\n" + diffExitHelp + " A run not ended yet exits 0.",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				d, err := c.GetDiff(ctx, &parityv1.GetDiffRequest{Name: diffName(args[0])})
				if err != nil {
					return callErr("GetDiff", err)
				}
				if err := printAnswer(cmd, &cf, d, printDiff); err != nil {
					return err
				}
				return diffExit(d)
			})
		},
	}
	cf.register(cmd.Flags(), 30*time.Second)
	return cmd
}

func newDiffWatchCommand() *cobra.Command {
	var (
		cf       clientFlags
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "watch RUN",
		Short: "Follow a verification run of a running `parity serve` to its end",
		Long: `watch shows a run's progress (a live line with a bar, chunks and tables done, rows/s,
differences and ETA on a terminal; a plain line at every update otherwise) until it
ends, then prints it. --json prints every update as one line of JSON.

` + diffExitHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.call(cmd, 0, func(_ context.Context, c parityv1.ParityClient) error {
				d, err := watchDiff(cmd, c, &cf, diffName(args[0]), interval)
				if err != nil {
					return err
				}
				return diffExit(d)
			})
		},
	}
	cf.register(cmd.Flags(), 0)
	cmd.Flags().DurationVar(&interval, "interval", 0, "how often the progress is updated (200ms to 1m; default: 500ms on a terminal, 5s otherwise)")
	return cmd
}

// watchDiff follows a run to its end and prints it; the run's last state is returned.
func watchDiff(cmd *cobra.Command, c parityv1.ParityClient, cf *clientFlags, name string, interval time.Duration) (*parityv1.Diff, error) {
	out := cmd.OutOrStdout()
	tty := !cf.json && isTerminal(out)
	if interval <= 0 {
		interval = 5 * time.Second
		if tty {
			interval = 500 * time.Millisecond
		}
	}
	ctx, cancel := cf.context(cmd, 0)
	defer cancel()
	stream, err := c.WatchDiff(ctx, &parityv1.WatchDiffRequest{Name: name, Interval: durOrNil(interval)})
	if err != nil {
		return nil, callErr("WatchDiff", err)
	}
	pp := &diffProgress{w: out, tty: tty}
	var last *parityv1.Diff
	for {
		d, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			pp.finish()
			return nil, callErr("WatchDiff", err)
		}
		last = d
		if cf.json {
			if err := printJSONLine(out, d); err != nil {
				return nil, err
			}
			continue
		}
		pp.update(d)
	}
	pp.finish()
	if last == nil {
		return nil, callErr("WatchDiff", errors.New("the stream ended without the run"))
	}
	if !cf.json {
		if err := printDiff(out, last); err != nil {
			return nil, err
		}
	}
	return last, nil
}

func isEnded(s parityv1.DiffState) bool {
	switch s {
	case parityv1.DiffState_DIFF_STATE_DONE, parityv1.DiffState_DIFF_STATE_FAILED,
		parityv1.DiffState_DIFF_STATE_CANCELLED, parityv1.DiffState_DIFF_STATE_SKIPPED:
		return true
	}
	return false
}

// diffExit is a run's exit status: exitClean equal or not ended, exitNotClean
// different, exitNoAnswer without a verdict (failed, cancelled, skipped).
func diffExit(d *parityv1.Diff) error {
	switch d.GetResult() {
	case parityv1.DiffResult_DIFF_RESULT_EQUAL:
		return nil
	case parityv1.DiffResult_DIFF_RESULT_DIFFERENT:
		return &exitError{code: exitNotClean}
	case parityv1.DiffResult_DIFF_RESULT_UNSPECIFIED:
		if !isEnded(d.GetState()) {
			return nil
		}
	}
	msg := fmt.Sprintf("run %s %s", d.GetRunId(), diffResultName(d.GetResult()))
	if d.GetResult() == parityv1.DiffResult_DIFF_RESULT_UNSPECIFIED {
		msg = fmt.Sprintf("run %s %s", d.GetRunId(), diffStateName(d.GetState()))
	}
	if d.GetError() != "" {
		msg += ": " + d.GetError()
	}
	return &exitError{code: exitNoAnswer, err: errors.New(msg)}
}

func newDiffCancelCommand() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "cancel RUN",
		Short: "Cancel a running verification run of a running `parity serve`",
		Long:  "cancel stops a run (it ends cancelled) and prints it; a run that had ended is printed unchanged.\n\nExit status: 0 done, 2 on error.",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				d, err := c.CancelDiff(ctx, &parityv1.CancelDiffRequest{Name: diffName(args[0])})
				if err != nil {
					return callErr("CancelDiff", err)
				}
				return printAnswer(cmd, &cf, d, printDiff)
			})
		},
	}
	cf.register(cmd.Flags(), time.Minute)
	return cmd
}

// parseEnum maps a lower-case name (or the enum's full name) to its value.
func parseEnum[T ~int32](flag, v, prefix string, values map[string]int32) (T, error) {
	if v == "" {
		return 0, nil
	}
	if n, ok := values[strings.ToUpper(v)]; ok {
		return T(n), nil
	}
	if n, ok := values[prefix+strings.ToUpper(strings.ReplaceAll(v, "-", "_"))]; ok && n != 0 {
		return T(n), nil
	}
	var names []string
	for k, n := range values {
		if n != 0 {
			names = append(names, strings.ToLower(strings.TrimPrefix(k, prefix)))
		}
	}
	sort.Strings(names)
	return 0, usageErr(fmt.Errorf("--%s: want one of %s, got %q", flag, strings.Join(names, ", "), v))
}

// parseTime reads an RFC 3339 time or a duration ago ("2h": two hours ago).
func parseTime(flag, v string) (*timestamppb.Timestamp, error) {
	if v == "" {
		return nil, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return timestamppb.New(t), nil
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return timestamppb.New(time.Now().Add(-d)), nil
	}
	return nil, usageErr(fmt.Errorf("--%s: want an RFC 3339 time or a duration ago (2h), got %q", flag, v))
}

func newDiffListCommand() *cobra.Command {
	var (
		cf                    clientFlags
		state, trigger        string
		after, before, pageTk string
		limit                 int32
		all                   bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List a running `parity serve`'s verification runs, newest first",
		Long:  "list prints the daemon's runs, newest first, a page at a time (--all: every page).\n\nExit status: 0 done, 2 on error.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := parseEnum[parityv1.DiffState]("state", state, "DIFF_STATE_", parityv1.DiffState_value)
			if err != nil {
				return err
			}
			req := &parityv1.ListDiffsRequest{PageSize: limit, PageToken: pageTk, State: st, Trigger: trigger}
			if req.StartTimeAfter, err = parseTime("after", after); err != nil {
				return err
			}
			if req.StartTimeBefore, err = parseTime("before", before); err != nil {
				return err
			}
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				var diffs []*parityv1.Diff
				for {
					resp, err := c.ListDiffs(ctx, req)
					if err != nil {
						return callErr("ListDiffs", err)
					}
					if cf.json && !all {
						return printJSON(cmd.OutOrStdout(), resp)
					}
					diffs = append(diffs, resp.GetDiffs()...)
					req.PageToken = resp.GetNextPageToken()
					if !all || req.PageToken == "" {
						break
					}
				}
				if cf.json {
					return printJSON(cmd.OutOrStdout(), &parityv1.ListDiffsResponse{Diffs: diffs})
				}
				if err := printDiffList(cmd.OutOrStdout(), diffs); err != nil {
					return err
				}
				if req.PageToken != "" && !all {
					fmt.Fprintf(cmd.ErrOrStderr(), "more: --page-token %s (or --all)\n", req.PageToken)
				}
				return nil
			})
		},
	}
	fl := cmd.Flags()
	cf.register(fl, 30*time.Second)
	fl.StringVar(&state, "state", "", "only runs in this state: queued, running, done, failed, cancelled, skipped")
	fl.StringVar(&trigger, "trigger", "", "only runs of this trigger: a schedule's name, continuous, manual, cutover-check")
	fl.StringVar(&after, "after", "", "only runs started at or after this RFC 3339 time, or this long ago (24h)")
	fl.StringVar(&before, "before", "", "only runs started before this RFC 3339 time, or this long ago")
	fl.Int32Var(&limit, "limit", 20, "runs per page (at most 1000)")
	fl.StringVar(&pageTk, "page-token", "", "the page after the previous one (printed on stderr)")
	fl.BoolVar(&all, "all", false, "every page")
	return cmd
}

func newDiffDifferencesCommand() *cobra.Command {
	var (
		cf                 clientFlags
		table, kind, class string
		pageTk             string
		limit              int32
		all                bool
	)
	cmd := &cobra.Command{
		Use:   "differences RUN",
		Short: "List the differing rows a verification run found (keys, kind, class; no row values)",
		Long:  "differences lists a run's differing rows in table and key order, a page at a time (--all: every page).\n\nExit status: 0 done, 2 on error.",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := parseEnum[parityv1.DifferenceKind]("kind", kind, "DIFFERENCE_KIND_", parityv1.DifferenceKind_value)
			if err != nil {
				return err
			}
			req := &parityv1.ListDifferencesRequest{Parent: diffName(args[0]), PageSize: limit, PageToken: pageTk, Table: table, Kind: k, Class: class}
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				var diffs []*parityv1.Difference
				var total int64
				for {
					resp, err := c.ListDifferences(ctx, req)
					if err != nil {
						return callErr("ListDifferences", err)
					}
					if cf.json && !all {
						return printJSON(cmd.OutOrStdout(), resp)
					}
					diffs = append(diffs, resp.GetDifferences()...)
					total = resp.GetTotalSize()
					req.PageToken = resp.GetNextPageToken()
					if !all || req.PageToken == "" {
						break
					}
				}
				if cf.json {
					return printJSON(cmd.OutOrStdout(), &parityv1.ListDifferencesResponse{Differences: diffs, TotalSize: total})
				}
				if err := printDifferences(cmd.OutOrStdout(), diffs, total); err != nil {
					return err
				}
				if req.PageToken != "" && !all {
					fmt.Fprintf(cmd.ErrOrStderr(), "more: --page-token %s (or --all)\n", req.PageToken)
				}
				return nil
			})
		},
	}
	fl := cmd.Flags()
	cf.register(fl, time.Minute)
	fl.StringVar(&table, "table", "", "only this schema.table (* and ? wildcards)")
	fl.StringVar(&kind, "kind", "", "only this kind: missing (in TiDB only), extra (in the fallback only), differing")
	fl.StringVar(&class, "class", "", "only this class: bypass, imported, post-import, cdc, diverged, unclassified")
	fl.Int32Var(&limit, "limit", 100, "differences per page (at most 1000)")
	fl.StringVar(&pageTk, "page-token", "", "the page after the previous one (printed on stderr)")
	fl.BoolVar(&all, "all", false, "every page")
	return cmd
}

func newDiffFixSQLCommand() *cobra.Command {
	var (
		cf    clientFlags
		table string
	)
	cmd := &cobra.Command{
		Use:   "fix-sql RUN",
		Short: "Print the SQL that makes the fallback equal to TiDB for a run's differences (to review; parity repair applies fixes safely)",
		Long:  "fix-sql streams the statements per table (--json: one object a chunk).\n\nExit status: 0 done, 2 on error.",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				stream, err := c.GetFixSQL(ctx, &parityv1.GetFixSQLRequest{Parent: diffName(args[0]), Table: table})
				if err != nil {
					return callErr("GetFixSQL", err)
				}
				out := cmd.OutOrStdout()
				current := ""
				for {
					ch, err := stream.Recv()
					if errors.Is(err, io.EOF) {
						return nil
					}
					if err != nil {
						return callErr("GetFixSQL", err)
					}
					if cf.json {
						err = printJSONLine(out, ch)
					} else {
						if ch.GetTable() != current {
							current = ch.GetTable()
							fmt.Fprintf(out, "-- %s\n", current)
						}
						_, err = io.WriteString(out, ch.GetSql())
					}
					if err != nil {
						return err
					}
				}
			})
		},
	}
	cf.register(cmd.Flags(), 0)
	cmd.Flags().StringVar(&table, "table", "", "only this schema.table (* and ? wildcards)")
	return cmd
}

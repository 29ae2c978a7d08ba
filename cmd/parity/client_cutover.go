package main

// client_cutover.go: `parity cutover-check`, the cutover gate, and `parity repair` over
// the gRPC API (CutoverCheck, Repair).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
)

func init() {
	addCommand(newCutoverCheckCommand)
	addCommand(newRepairCommand)
}

func newCutoverCheckCommand() *cobra.Command {
	var (
		cf          clientFlags
		tsArg       string
		now         bool
		maxFullAge  time.Duration
		tables      []string
		waitTimeout time.Duration
		full        bool
		fullTables  []string
	)
	cmd := &cobra.Command{
		Use:   "cutover-check (--ts TSO | --now)",
		Short: "The cutover gate: prove the fallback equal to TiDB at a TSO, with the evidence",
		Long: `cutover-check asks a running parity serve to wait until the upstream TSO is applied
to the fallback, take a snapshot pair at or after it, verify every key changed since
the last clean full run of each table, and answer pass or fail with the evidence: the
TSO, the fallback's GTID or binlog position at it, the tables and keys verified, each
table's last full run and its age, and the differences with their classification. A
table without a clean full run, or with one older than --max-full-age, fails.

The keys verified are those the changefeed changed (the ledger) and those of writes
made straight into the fallback, bypassing parity (the bypass detector's records).
A table whose window the detector did not watch whole fails as bypass-unwatched:
[bypass] off, started after the table's last full run, or a gap in its watching
(its position deleted after a purge). So does one with a DDL made straight in the
fallback (bypass-ddl). --full (every table) or --full-tables PATTERN compares
tables whole at the pair instead: no earlier full run and no watched window needed,
at the cost of a full comparison of those tables.

--now checks at the upstream's current TSO: with writes to the upstream stopped, the
quiescent point.

Exit status: 0 passed, 1 failed (or the TSO was not applied within --wait-timeout),
2 on error.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req := &parityv1.CutoverCheckRequest{Tables: tables, MaxFullDiffAge: durOrNil(maxFullAge), WaitTimeout: durOrNil(waitTimeout),
				Full: full, FullTables: fullTables}
			switch {
			case now && tsArg != "":
				return usageErr(errors.New("--ts and --now: give one"))
			case now:
				req.Upstream = &parityv1.CutoverCheckRequest_Now{Now: true}
			case tsArg != "":
				ts, err := strconv.ParseUint(tsArg, 10, 64)
				if err != nil || ts == 0 {
					return usageErr(fmt.Errorf("--ts: want a TiDB TSO, got %q", tsArg))
				}
				req.Upstream = &parityv1.CutoverCheckRequest_UpstreamTs{UpstreamTs: ts}
			default:
				return usageErr(errors.New("--ts or --now: the upstream TSO to check at is required"))
			}
			if maxFullAge < 0 || waitTimeout < 0 {
				return usageErr(errors.New("--max-full-age and --wait-timeout: want 0 (the default) or more"))
			}
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				resp, err := c.CutoverCheck(ctx, req)
				if status.Code(err) == codes.DeadlineExceeded && errorReason(err) == parityv1.ErrorReason_DEADLINE.String() {
					fmt.Fprintf(cmd.ErrOrStderr(), "parity: cutover check FAILED: %s\n", describeCallErr("CutoverCheck", err))
					return &exitError{code: exitNotClean}
				}
				if err != nil {
					return callErr("CutoverCheck", err)
				}
				if err := printAnswer(cmd, &cf, resp, printCutover); err != nil {
					return err
				}
				if !resp.GetPassed() {
					return &exitError{code: exitNotClean}
				}
				return nil
			})
		},
	}
	fl := cmd.Flags()
	cf.register(fl, 30*time.Minute)
	fl.StringVar(&tsArg, "ts", "", "the upstream TSO the fallback must have applied")
	fl.BoolVar(&now, "now", false, "check at the upstream's current TSO (the quiescent point once writes are stopped)")
	fl.DurationVar(&maxFullAge, "max-full-age", 0, "the oldest a table's last clean full run may be (default: the daemon's, 7 days)")
	fl.StringArrayVar(&tables, "table", nil, "schema.table pattern to check (repeatable; default: verify.tables)")
	fl.DurationVar(&waitTimeout, "wait-timeout", 0, "how long to wait for the TSO to be applied (default: --timeout)")
	fl.BoolVar(&full, "full", false, "compare every selected table whole at the pair (no earlier full run or watched window needed)")
	fl.StringArrayVar(&fullTables, "full-tables", nil, "schema.table pattern of tables to compare whole at the pair (repeatable)")
	return cmd
}

// cutoverDifferencesShown bounds the differences printed (--json has all the answer
// carries; parity diff differences lists every one).
const cutoverDifferencesShown = 20

func printCutover(w io.Writer, r *parityv1.CutoverCheckResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	verdict := "FAILED"
	if r.GetPassed() {
		verdict = "PASSED"
	}
	fmt.Fprintf(tw, "cutover check:\t%s\n", verdict)
	fmt.Fprintf(tw, "upstream ts:\t%s (waited %s)\n", fmtTS(r.GetUpstreamTs()), fmtDur(r.GetWaited()))
	if p := r.GetPair(); p != nil {
		fmt.Fprintf(tw, "snapshot pair:\tTiDB at %s = fallback at %s (%s), paused %s\n", fmtTS(p.GetTs()), p.GetDownstreamPosition(), p.GetPositionSource(), fmtDur(p.GetPause()))
	}
	if r.GetDiff() != "" {
		fmt.Fprintf(tw, "verification run:\t%s\n", runIDOf(r.GetDiff()))
	}
	fmt.Fprintf(tw, "keys verified:\t%d\n", r.GetKeysVerified())
	var n int64
	for _, t := range r.GetTables() {
		n += t.GetDifferences()
	}
	if len(r.GetDifferences()) > 0 && int64(len(r.GetDifferences())) > n {
		n = int64(len(r.GetDifferences()))
	}
	fmt.Fprintf(tw, "differences:\t%d", n)
	if len(r.GetDifferencesByClass()) > 0 {
		fmt.Fprintf(tw, " (%s)", fmtByClass(r.GetDifferencesByClass()))
	}
	fmt.Fprintln(tw)
	if b := r.GetBypass(); b != "" {
		fmt.Fprintf(tw, "bypass detection:\t%s\n", b)
	}
	if u := r.GetUnconfirmed(); u > 0 {
		fmt.Fprintf(tw, "unconfirmed:\t%d rows different when first read at the pair, equal when read again at it: a snapshot read that was not repeatable (see the runbook's ParitySnapshotReadNotRepeatable before cutting over)\n", u)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.GetFailures()) > 0 {
		fmt.Fprintln(w, "\nfailures:")
		for _, f := range r.GetFailures() {
			fmt.Fprintf(w, "  - %s\n", f)
		}
	}
	if len(r.GetTables()) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TABLE\tRESULT\tLAST FULL RUN\tAGE\tSINCE TS\tKEYS\tLEDGER KEYS\tBYPASS\tBYPASS KEYS\tDIFFERENCES")
		for _, t := range r.GetTables() {
			last := runIDOf(t.GetLastFullDiff())
			if last == "" {
				last = "-"
			}
			bypass := t.GetBypass()
			switch {
			case t.GetFull():
				bypass = "(compared whole)"
			case bypass == "":
				bypass = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%d\t%d\n", t.GetTable(), t.GetResult(), last, fmtDur(t.GetLastFullAge()), t.GetSinceTs(),
				t.GetKeysVerified(), t.GetLedgerKeys(), bypass, t.GetBypassKeys(), t.GetDifferences())
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.GetDifferences()) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "TABLE\tKIND\tCLASS\tKEY")
		for i, d := range r.GetDifferences() {
			if i == cutoverDifferencesShown {
				fmt.Fprintf(tw, "... %d more (parity diff differences %s)\n", len(r.GetDifferences())-i, runIDOf(r.GetDiff()))
				break
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", d.GetTable(), kindName(d.GetKind()), d.GetClass(), d.GetKey())
		}
		return tw.Flush()
	}
	return nil
}

func newRepairCommand() *cobra.Command {
	var (
		cf     clientFlags
		runID  string
		tables []string
		dry    bool
	)
	cmd := &cobra.Command{
		Use:   "repair (RUN | --run RUN)",
		Short: "Repair a run's differences through a running `parity serve`'s apply stream, then verify again",
		Long: `repair asks a running parity serve (verify.enabled; a token with the repair role) to
repair the differences a run stored: a verification run's (parity diff list) or a
parity diff run's in the daemon's meta schema. Inside the applier's barrier at its
applied checkpoint T, each key's row is read from TiDB at T and written to the
fallback with the applier's own statements (REPLACE, or a delete by key when TiDB has
no row), so no replicated change can race the fix; tables without a primary or NOT
NULL unique key are refused. Every key is recorded in the meta schema's repairs table.
Then the tables of the repaired keys are verified again, whole: a full verification
run of those tables at a new snapshot pair (every row, not only the repaired keys).

--dry-run examines every key the same way and prints what it would do, writing nothing.

Exit status: 0 when the re-verification found the tables equal (a dry run: nothing to
change), 1 when any of their rows still differ — a refused key, or another row that
differs since the run (a dry run: keys to repair), 2 on error or when the
re-verification has no verdict.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case len(args) == 1 && runID != "" && diffName(args[0]) != diffName(runID):
				return usageErr(fmt.Errorf("the run is given twice: %s and --run %s", args[0], runID))
			case len(args) == 1:
				runID = args[0]
			case runID == "":
				return usageErr(errors.New("--run: the run whose differences to repair is required"))
			}
			return cf.call(cmd, 0, func(ctx context.Context, c parityv1.ParityClient) error {
				resp, err := c.Repair(ctx, &parityv1.RepairRequest{Diff: diffName(runID), Tables: tables, DryRun: dry})
				if err != nil {
					return callErr("Repair", err)
				}
				if err := printAnswer(cmd, &cf, resp, func(w io.Writer, r *parityv1.RepairResponse) error { return printAPIRepair(w, runID, r) }); err != nil {
					return err
				}
				return apiRepairExit(resp)
			})
		},
	}
	fl := cmd.Flags()
	cf.register(fl, 0)
	fl.StringVar(&runID, "run", "", "the verification run (or parity diff run) whose differences to repair")
	fl.StringArrayVar(&tables, "table", nil, "repair only this upstream schema.table (repeatable; * and ? wildcards)")
	fl.BoolVar(&dry, "dry-run", false, "print what the repair would do; write nothing")
	fl.Lookup("timeout").Usage = "give up waiting after this long (0: wait for the end; interrupting stops the repair between statements, what was done is recorded)"
	return cmd
}

// repairKeysShown bounds the keys printed (all are in --json and the meta schema).
const repairKeysShown = 20

// apiRepairExit is the exit status of a repair (see the command's help).
func apiRepairExit(r *parityv1.RepairResponse) error {
	if r.GetDryRun() {
		if r.GetUpserted()+r.GetDeleted()+r.GetRefused() > 0 {
			return &exitError{code: exitNotClean}
		}
		return nil
	}
	switch r.GetVerifyResult() {
	case parityv1.DiffResult_DIFF_RESULT_EQUAL:
		return nil
	case parityv1.DiffResult_DIFF_RESULT_DIFFERENT:
		return &exitError{code: exitNotClean}
	case parityv1.DiffResult_DIFF_RESULT_UNSPECIFIED:
		if len(r.GetKeys()) == 0 {
			return nil // nothing to repair
		}
		return &exitError{code: exitNoAnswer, err: errors.New("the repaired tables were not verified again")}
	}
	return &exitError{code: exitNoAnswer, err: fmt.Errorf("re-verification run %s %s", runIDOf(r.GetVerifyDiff()), diffResultName(r.GetVerifyResult()))}
}

func printAPIRepair(w io.Writer, runID string, r *parityv1.RepairResponse) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if r.GetRepairId() != "" {
		fmt.Fprintf(tw, "repair:\t%s\n", r.GetRepairId())
	}
	fmt.Fprintf(tw, "run:\t%s\n", runIDOf(runID))
	if r.GetDryRun() {
		fmt.Fprintf(tw, "dry run:\tyes (nothing was written)\n")
	}
	verb := ""
	if r.GetDryRun() {
		verb = "would be "
	}
	fmt.Fprintf(tw, "keys:\t%d: %d %supserted, %d %sdeleted, %d unchanged, %d refused\n", len(r.GetKeys()),
		r.GetUpserted(), verb, r.GetDeleted(), verb, r.GetUnchanged(), r.GetRefused())
	if r.GetMaxPause() != nil {
		fmt.Fprintf(tw, "applier held:\tlongest %s\n", fmtDur(r.GetMaxPause()))
	}
	switch {
	case r.GetVerifyDiff() != "":
		fmt.Fprintf(tw, "re-verification:\t%s %s\n", runIDOf(r.GetVerifyDiff()), diffResultName(r.GetVerifyResult()))
	case r.GetDryRun():
	case len(r.GetKeys()) == 0:
		fmt.Fprintf(tw, "re-verification:\tnone (nothing to repair)\n")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.GetKeys()) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tKEY\tACTION\tREPAIR TS\tREASON")
	for i, k := range r.GetKeys() {
		if i == repairKeysShown {
			fmt.Fprintf(tw, "... %d more (--json prints every key)\n", len(r.GetKeys())-i)
			break
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", k.GetTable(), k.GetKey(), k.GetAction(), k.GetTs(), k.GetReason())
	}
	return tw.Flush()
}

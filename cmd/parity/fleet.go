package main

// fleet.go is `parity fleet`: one answer over many fallbacks (package fleet) — status,
// verification at one fleet point, the fleet cutover check — from a fleet file.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tidb-parity/parity/api"
	"github.com/tidb-parity/parity/fleet"
	"github.com/tidb-parity/parity/internal/tso"
)

func init() { addCommand(newFleetCommand) }

// fleetFlags are the flags every fleet command shares.
type fleetFlags struct {
	file    string
	json    bool
	timeout time.Duration
	verbose bool
}

func (f *fleetFlags) register(cmd *cobra.Command, timeout time.Duration) {
	fs := cmd.Flags()
	fs.StringVar(&f.file, "fleet", os.Getenv("PARITY_FLEET"), "the fleet file: members, their addresses and the tables each owns (env PARITY_FLEET)")
	fs.BoolVar(&f.json, "json", false, "print the answer as JSON")
	fs.DurationVar(&f.timeout, "timeout", timeout, "bound on the whole command")
	fs.BoolVarP(&f.verbose, "verbose", "v", false, "log the fleet's progress to stderr")
}

// open loads the fleet file and dials its members; the context carries --timeout.
func (f *fleetFlags) open(cmd *cobra.Command) (*fleet.Fleet, context.Context, context.CancelFunc, error) {
	if f.file == "" {
		return nil, nil, nil, usageErr(errors.New("--fleet: the fleet file is required"))
	}
	cfg, err := fleet.Load(f.file)
	if err != nil {
		return nil, nil, nil, usageErr(err)
	}
	var log *slog.Logger
	if f.verbose {
		log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
	}
	fl, err := fleet.Open(cfg, log)
	if err != nil {
		return nil, nil, nil, usageErr(err)
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
	return fl, ctx, cancel, nil
}

func (f *fleetFlags) print(w io.Writer, v any, human func(io.Writer) error) error {
	if f.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return human(w)
}

// fleetErr is a fleet command's failure to answer (exit 2); an ownership problem names
// its tables.
func fleetErr(what string, err error) error {
	return &exitError{code: exitNoAnswer, err: fmt.Errorf("fleet %s: %w", what, err)}
}

func newFleetCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "One answer over many fallbacks: status, verification and the cutover check of a fleet",
		Long: `A fleet is the fallback of a sharded estate: many fallback servers, each fed by its own
changefeed and kept by its own parity serve (with its standbys). The fleet file names the
members (their gRPC addresses, active and standby) and the tables each owns; every table
the fleet selects must be owned by exactly one member (a table owned by none or by two
fails every fleet command, named). TiDB's TSO is the fleet's clock: verification and the
cutover check take every member's snapshot pair at one TSO T (deploy/fleet.example.toml,
docs/runbook.md "A sharded estate").`,
	}
	cmd.AddCommand(newFleetStatusCommand(), newFleetVerifyCommand(), newFleetCutoverCommand(), newFleetServeCommand())
	return cmd
}

func newFleetStatusCommand() *cobra.Command {
	var ff fleetFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Every member's lag, freshness, state and last verification; the fleet's lag is the worst member's",
		Long: `status asks every member's active daemon for its status. Exit status: 0 when every
member answered, 2 when one did not (it is named).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fl, ctx, cancel, err := ff.open(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			defer fl.Close()
			st := fl.Status(ctx)
			if err := ff.print(cmd.OutOrStdout(), st, func(w io.Writer) error { return printFleetStatus(w, st) }); err != nil {
				return err
			}
			if st.Unreachable > 0 {
				return &exitError{code: exitNoAnswer, err: fmt.Errorf("fleet status: %d member(s) did not answer", st.Unreachable)}
			}
			return nil
		},
	}
	ff.register(cmd, 30*time.Second)
	return cmd
}

func printFleetStatus(w io.Writer, st fleet.Status) error {
	fmt.Fprintf(w, "fleet %s: lag %.1fs (worst: %s), %d member(s), %d unreachable\n", st.Fleet, st.Lag, orDash(st.WorstMember), len(st.Members), st.Unreachable)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tADDR\tSTATE\tAPPLIED TS\tLAG\tFRESHNESS\tLAST RUN\tRESULT\tBYPASS\tDETECTIONS\tERROR")
	for _, m := range st.Members {
		fresh := "-"
		if m.Freshness >= 0 {
			fresh = fmt.Sprintf("%.1fs", m.Freshness)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.1fs\t%s\t%s\t%s\t%s\t%d\t%s\n", m.Member, orDash(m.Addr), orDash(m.State), m.AppliedTS, m.AppliedLag,
			fresh, orDash(m.LastRun), orDash(m.LastResult), m.Bypass, m.Detections, m.Error)
	}
	return tw.Flush()
}

func newFleetVerifyCommand() *cobra.Command {
	var (
		ff    fleetFlags
		scope string
		rate  int64
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Verify every member at one fleet point T; differences named by member, table, key and class",
		Long: `verify starts a verification run on every member whose first snapshot pair is at exactly
one TSO T (TiDB's current TSO when it starts; a member that has applied past T refuses
it and the fleet point is taken again at a newer T), waits for all of them, and lists
the differences by member. Exit status: 0 equal, 1 differences, 2 no answer.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fl, ctx, cancel, err := ff.open(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			defer fl.Close()
			res, err := fl.Verify(ctx, fleet.VerifyRequest{Scope: scope, MaxRowsPerSecond: rate})
			if err != nil {
				return fleetErr("verify", err)
			}
			if err := ff.print(cmd.OutOrStdout(), res, func(w io.Writer) error { return printFleetVerify(w, res) }); err != nil {
				return err
			}
			switch res.Result {
			case "equal":
				return nil
			case "different":
				return &exitError{code: exitNotClean}
			}
			return &exitError{code: exitNoAnswer, err: errors.New("fleet verify: a member's run did not end equal or different")}
		},
	}
	ff.register(cmd, 6*time.Hour)
	cmd.Flags().StringVar(&scope, "scope", "full", "full, cdc or since:<TSO|RFC 3339 time>")
	cmd.Flags().Int64Var(&rate, "max-rows-per-second", 0, "cap each member's run (0: its verify.max-rows-per-second)")
	return cmd
}

func printFleetVerify(w io.Writer, r fleet.VerifyResult) error {
	fmt.Fprintf(w, "fleet %s: %s at T %d (%s), %d attempt(s); slowest pause %v; took %v\n", r.Fleet, strings.ToUpper(r.Result), r.T,
		tso.Format(r.T), r.Attempts, r.MaxPause.Round(time.Millisecond), r.Took.Round(time.Millisecond))
	printMemberRuns(w, r.Members)
	if len(r.Differences) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "MEMBER\tTABLE\tKEY\tKIND\tCLASS")
		for _, d := range r.Differences {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Member, d.Table, d.Key, d.Kind, d.Class)
		}
		return tw.Flush()
	}
	return nil
}

func printMemberRuns(w io.Writer, runs []fleet.MemberRun) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tADDR\tRESULT\tRUN\tPAIR TS\tPOSITION\tPAUSE\tKEYS\tDIFFERENCES\tBY CLASS\tERROR")
	for _, m := range runs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%v\t%d\t%d\t%s\t%s\n", m.Member, orDash(m.Addr), m.Result, orDash(m.RunID), m.PairTS,
			orDash(m.PairPosition), m.Pause.Round(time.Millisecond), m.Keys, m.Differences, byClass(m.ByClass), m.Error)
	}
	_ = tw.Flush()
}

func byClass(m map[string]int64) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func newFleetCutoverCommand() *cobra.Command {
	var (
		ff         fleetFlags
		maxFullAge time.Duration
		wait       time.Duration
		full       bool
		fullTables []string
	)
	cmd := &cobra.Command{
		Use:   "cutover-check",
		Short: "The fleet's cutover gate: every member checked at one TSO T, one answer",
		Long: `cutover-check, once writes to TiDB have stopped, takes T = TiDB's current TSO and asks
every member, concurrently, for its cutover check with its snapshot pair at exactly T.
It passes only when every member passed at T and every table the fleet selects is owned
by a member that passed and verified it. A member that does not answer (its daemon gone
and no standby taking over within fleet.failover), lags past --wait-timeout or fails is
named with its reason; a member whose daemon is replaced by its standby mid-check is
asked again. The evidence is per member: its pair TSO (T), the fallback's GTID or binlog
position there, the keys verified, the differences by class.

Exit status: 0 passed, 1 not passed, 2 no answer (the fleet file, the ownership of a
table, or members that did not answer).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fl, ctx, cancel, err := ff.open(cmd)
			if err != nil {
				return err
			}
			defer cancel()
			defer fl.Close()
			res, err := fl.CutoverCheck(ctx, fleet.CutoverRequest{MaxFullAge: maxFullAge, Wait: wait, Full: full, FullTables: fullTables})
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "parity: fleet cutover check FAILED: %v\n", err)
				return fleetErr("cutover-check", err)
			}
			if err := ff.print(cmd.OutOrStdout(), res, func(w io.Writer) error { return printFleetCutover(w, res) }); err != nil {
				return err
			}
			switch {
			case res.Passed:
				return nil
			case res.NoAnswer():
				return &exitError{code: exitNoAnswer}
			}
			return &exitError{code: exitNotClean}
		},
	}
	ff.register(cmd, time.Hour)
	fs := cmd.Flags()
	fs.DurationVar(&maxFullAge, "max-full-age", 0, "the oldest a table's last clean full run may be (0: the members' default, 7 days)")
	fs.DurationVar(&wait, "wait-timeout", 0, "bound on each member's wait for its applier to reach T (0: 10 min)")
	fs.BoolVar(&full, "full", false, "compare every table whole at T")
	fs.StringSliceVar(&fullTables, "full-tables", nil, "compare the tables these schema.table patterns match whole at T")
	return cmd
}

func printFleetCutover(w io.Writer, r fleet.CutoverResult) error {
	verdict := "PASSED"
	if !r.Passed {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "fleet cutover check %s: %s at T %d (%s), %d attempt(s), %d table(s) over %d member(s)\n", r.Fleet, verdict, r.T, tso.Format(r.T),
		r.Attempts, len(r.Tables), len(r.Members))
	fmt.Fprintf(w, "slowest pause %v; slowest member %v; fleet %v\n", r.MaxPause.Round(time.Millisecond), r.Slowest.Round(time.Millisecond), r.Took.Round(time.Millisecond))
	printMemberRuns(w, r.Members)
	for _, f := range r.Failures {
		fmt.Fprintf(w, "FAIL %s\n", f)
	}
	return nil
}

func newFleetServeCommand() *cobra.Command {
	var (
		file     string
		cfg      = api.DefaultConfig()
		logLevel string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the Fleet gRPC API (fleet status, verification, the cutover check) for runbooks",
		Long: `serve answers the parity.v1.Fleet service on --addr: GetFleetStatus, VerifyFleet and
FleetCutoverCheck, what parity fleet status|verify|cutover-check print, for a runbook that
calls gRPC (api/README.md, "The Fleet service"). Tokens and TLS as parity serve's [api]:
GetFleetStatus needs the read role, VerifyFleet and FleetCutoverCheck operate. It stops on
SIGTERM or SIGINT (exit 0).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return usageErr(errors.New("--fleet: the fleet file is required"))
			}
			fc, err := fleet.Load(file)
			if err != nil {
				return usageErr(err)
			}
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return usageErr(fmt.Errorf("--log-level: %w", err))
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: lvl}))
			if err := cfg.Validate(); err != nil {
				return usageErr(err)
			}
			auth, err := api.NewAuthenticator(cfg.TokenFile, cfg.TLS, log)
			if err != nil {
				return usageErr(err)
			}
			if err := api.CheckExposure(cfg.Addr, cfg.Insecure, auth); err != nil {
				return usageErr(err)
			}
			fl, err := fleet.Open(fc, log)
			if err != nil {
				return usageErr(err)
			}
			defer fl.Close()
			srv, err := api.New(cfg, api.Backend{}, api.Options{Logger: log, Auth: auth, Fleet: fl})
			if err != nil {
				return usageErr(err)
			}
			ln, err := net.Listen("tcp", cfg.Addr)
			if err != nil {
				return usageErr(fmt.Errorf("--addr: %w", err))
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			log.Info("fleet API serving", "fleet", fc.Fleet.Name, "addr", ln.Addr().String(), "members", len(fc.Members))
			return srv.Run(ctx, ln)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&file, "fleet", os.Getenv("PARITY_FLEET"), "the fleet file (env PARITY_FLEET)")
	fs.StringVar(&cfg.Addr, "addr", "127.0.0.1:8393", "address to serve the Fleet API on")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "the tokens file (as api.token-file of parity serve)")
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert", "", "the server's certificate (PEM)")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key", "", "the server certificate's key (PEM)")
	fs.StringVar(&cfg.TLS.ClientCAFile, "tls-client-ca", "", "CA that client certificates must chain to (mutual TLS)")
	fs.BoolVar(&cfg.Insecure, "insecure", false, "serve a non-loopback address without tokens or TLS (as api.insecure)")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}

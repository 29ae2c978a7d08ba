package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/config"
	"github.com/tidb-parity/parity/internal/tso"
)

func init() {
	addCommand(newDiffCommand)
}

// diffFlags are the flags that are not settings, or add to lists (the others are read
// through diffBindings).
type diffFlags struct {
	config        string
	exclude       []string
	ignoreColumns []string
	where         string
	resume        string
	verbose       int
	cpuProfile    string
}

func newDiffCommand() *cobra.Command {
	var f diffFlags
	cmd := &cobra.Command{
		Use:   "diff",
		Short: "Compare tables between upstream and downstream; report differences and write fix SQL",
		Long: `Compare tables between an upstream (TiDB or MySQL) and a downstream MySQL/MariaDB with
chunked, pushed-down checksums, drill down to the differing rows and write fix SQL.

  parity diff --config diff.toml
  parity diff --upstream 'root@tcp(tidb:4000)/' --downstream 'root@tcp(mysql:3306)/' \
      --table shop.orders --table 'shop.user_*' --output ./diff-out

Exit status: 0 when everything is equal, 1 when differences were found, 2 on error.
A run is persisted in parity_meta on the downstream; resume a killed run with --resume RUN_ID.

The subcommands (start, get, watch, cancel, list, differences, fix-sql) drive the
verification runs of a running parity serve over its gRPC API instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			code, err := runDiff(cmd, &f)
			if code == exitClean {
				return nil
			}
			return &exitError{code: code, err: err}
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "TOML config file (see deploy/diff.example.toml); flags override it")
	fl.String("upstream", "", "upstream DSN, e.g. 'root@tcp(127.0.0.1:4000)/'")
	fl.String("downstream", "", "downstream DSN")
	fl.String("snapshot", "", "read the upstream at this TiDB TSO (tidb_snapshot)")
	fl.StringArray("table", nil, "table to compare, schema.table with * and ? wildcards (repeatable)")
	fl.StringArrayVar(&f.exclude, "exclude", nil, "table pattern to leave out (repeatable)")
	fl.StringArrayVar(&f.ignoreColumns, "ignore-column", nil, "schema.table.column pattern to leave out (repeatable)")
	fl.StringVar(&f.where, "where", "", "row filter applied to every table on both sides")
	fl.String("output", "", "directory for report.json and fix SQL")
	fl.StringVar(&f.resume, "resume", "", "resume the run with this ID")
	fl.Int("concurrency", 0, "chunks compared at once (default 4)")
	fl.Int("max-rows-per-second", 0, "cap on rows checksummed per second (0: none)")
	fl.Int64("max-differences", 0, "stop drilling down a table once this many of its rows differ (default 100000; 0: never)")
	fl.Int("recheck-rounds", 0, "read the rows of differences again this many times when not both sides are at a snapshot (default 1; 0: never)")
	fl.Duration("recheck-delay", 0, "wait this long after the comparison before re-reading differences (default 0; with --changefeed also until its checkpoint passes)")
	fl.Int("max-threads-running", 0, "pause while downstream Threads_running is above this (0: never)")
	fl.String("changefeed", "", "changefeed.id: parity serve's changefeed replicating into the downstream (for --max-lag)")
	fl.String("changefeed-meta-schema", "", "changefeed.meta-schema: parity serve's applier.meta-schema on the downstream (default parity_meta)")
	fl.Duration("max-lag", 0, "changefeed.max-lag: pause while that changefeed lags by more than this (0: never)")
	fl.String("scope", "", "what to compare: full (default; every row), cdc (keys the changefeed changed since each table's last clean verification) or since:<TSO|RFC 3339 time> (keys it changed after that); the scoped forms need --changefeed")
	fl.Duration("caught-up-lag", 0, "classify a key last changed before the applier first came within this lag of real time as post-import, later as cdc (default 30s)")
	fl.Duration("query-timeout", 0, "timeout of every query (default 5m)")
	fl.String("hash", "", "per-row hash: sha1 (default), md5")
	fl.String("tidb-checksum", "", "where a TiDB side computes checksums: auto (default: pushdown on TiKV, tidb on unistore), pushdown or tidb")
	fl.CountVarP(&f.verbose, "verbose", "v", "log progress details to stderr (-vv: also every mismatched chunk)")
	fl.StringVar(&f.cpuProfile, "cpu-profile", "", "write a Go CPU profile of the run to this file (for `go tool pprof`)")
	// The daemon's verification runs, over its gRPC API (client_diff.go).
	cmd.AddCommand(newDiffAPICommands()...)
	return cmd
}

// diffBindings ties diff's flags to their keys (the flags that add to lists, --exclude,
// --ignore-column and --where, are applied by loadDiffConfig).
var diffBindings = []config.Binding{
	{Flag: "upstream", Key: "upstream.dsn"},
	{Flag: "downstream", Key: "downstream.dsn"},
	{Flag: "snapshot", Key: "upstream.snapshot"},
	{Flag: "table", Key: "tables"},
	{Flag: "output", Key: "output"},
	{Flag: "concurrency", Key: "concurrency"},
	{Flag: "max-rows-per-second", Key: "max-rows-per-second"},
	{Flag: "max-threads-running", Key: "max-threads-running"},
	{Flag: "changefeed", Key: "changefeed.id"},
	{Flag: "changefeed-meta-schema", Key: "changefeed.meta-schema"},
	{Flag: "max-lag", Key: "changefeed.max-lag"},
	{Flag: "scope", Key: "scope"},
	{Flag: "caught-up-lag", Key: "caught-up-lag"},
	{Flag: "max-differences", Key: "max-differences"},
	{Flag: "recheck-rounds", Key: "recheck-rounds"},
	{Flag: "recheck-delay", Key: "recheck-delay"},
	{Flag: "query-timeout", Key: "query-timeout"},
	{Flag: "hash", Key: "hash"},
	{Flag: "tidb-checksum", Key: "tidb-checksum"},
}

// loadDiffConfig merges the config file and the flags. The file's keys are kebab-case;
// the snake_case keys of earlier releases still work, each with a warning on stderr
// that names the new key.
func loadDiffConfig(cmd *cobra.Command, f *diffFlags) (checker.Config, error) {
	cfg := checker.DefaultConfig()
	if f.config != "" {
		warnings, err := config.Load(f.config, &cfg, config.Options{Legacy: true})
		for _, w := range warnings {
			fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
		}
		if err != nil {
			return cfg, err
		}
	}
	fl := cmd.Flags()
	if err := config.Apply(&cfg, fl, diffBindings); err != nil {
		return cfg, err
	}
	if fl.Changed("exclude") {
		cfg.Exclude = append(cfg.Exclude, f.exclude...)
	}
	if fl.Changed("ignore-column") {
		cfg.IgnoreColumns = append(cfg.IgnoreColumns, f.ignoreColumns...)
	}
	if fl.Changed("where") {
		cfg.TableConfigs = append([]checker.TableConfig{{Table: "*.*", Where: f.where}}, cfg.TableConfigs...)
	}
	cfg.Resume = f.resume
	var errs []error
	if cfg.Upstream.DSN == "" {
		errs = append(errs, errors.New("upstream.dsn (--upstream) is required"))
	}
	if cfg.Downstream.DSN == "" {
		errs = append(errs, errors.New("downstream.dsn (--downstream) is required"))
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	return cfg, errors.Join(errs...)
}

func runDiff(cmd *cobra.Command, f *diffFlags) (int, error) {
	cfg, err := loadDiffConfig(cmd, f)
	if err != nil {
		return exitNoAnswer, err
	}
	stderr := cmd.ErrOrStderr()
	for _, w := range cfg.TLSWarnings() {
		fmt.Fprintln(stderr, "warning:", w)
	}
	if err := cfg.ApplyTLS(); err != nil {
		return exitNoAnswer, err
	}
	level := slog.LevelWarn
	switch {
	case f.verbose >= 2:
		level = slog.LevelDebug
	case f.verbose == 1:
		level = slog.LevelInfo
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	tty := false
	if fd, ok := stderr.(interface{ Fd() uintptr }); ok {
		tty = term.IsTerminal(int(fd.Fd()))
	}
	pr := &progressPrinter{w: stderr, tty: tty}
	cfg.Progress = pr.update
	cfg.Started = func(id string) {
		fmt.Fprintf(stderr, "parity diff run %s started (if it stops, continue it with --resume %s)\n", id, id)
	}

	if f.cpuProfile != "" {
		pf, err := os.Create(f.cpuProfile)
		if err != nil {
			return exitNoAnswer, fmt.Errorf("cpu profile: %w", err)
		}
		defer pf.Close()
		if err := pprof.StartCPUProfile(pf); err != nil {
			return exitNoAnswer, fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cfg.Changefeed.ID != "" {
		lag, closeLag, err := changefeedLag(cfg)
		if err != nil {
			return exitNoAnswer, err
		}
		defer closeLag()
		cfg.Lag = lag
	}
	rep, err := checker.NewDiff(cfg, nil).Run(ctx)
	pr.finish()
	if err != nil {
		var re *checker.RunError
		// A scope the ledger cannot serve is refused before anything is compared: there is
		// nothing to resume.
		if errors.As(err, &re) && !errors.Is(err, checker.ErrScopeUnavailable) {
			return exitNoAnswer, fmt.Errorf("%w (resume with: parity diff --resume %s ...)", err, re.RunID)
		}
		return exitNoAnswer, err
	}
	printSummary(cmd.OutOrStdout(), rep, cfg.OutputDir)
	if rep.Equal {
		return exitClean, nil
	}
	return exitNotClean, nil
}

// progressPrinter draws a progress bar with ETA on a terminal, plain lines otherwise.
type progressPrinter struct {
	w        io.Writer
	tty      bool
	last     time.Time
	drawn    bool
	finalMsg string
	phase    string // what the last line said the run was doing
}

func (p *progressPrinter) update(pr checker.Progress) {
	now := time.Now()
	interval := 10 * time.Second
	if p.tty {
		interval = 200 * time.Millisecond
	}
	phase := "compare"
	if pr.Rechecking {
		phase = "recheck"
		if pr.ChangefeedLag > 0 {
			phase = "recheck-wait"
		}
	}
	if now.Sub(p.last) < interval && phase == p.phase {
		return
	}
	p.last, p.phase = now, phase
	if pr.Rechecking {
		msg := fmt.Sprintf("run %s: re-checking %d differences", pr.RunID, pr.Differences)
		if pr.ChangefeedLag > 0 {
			msg += fmt.Sprintf(" (waiting for the changefeed, %s behind, to pass the comparison)", pr.ChangefeedLag.Round(time.Second))
		}
		if p.tty {
			fmt.Fprintf(p.w, "\r\033[K%s", msg)
			p.drawn = true
		} else {
			fmt.Fprintln(p.w, msg)
		}
		return
	}
	frac := 0.0
	if pr.RowsEstimated > 0 {
		frac = min(1, float64(pr.RowsChecked)/float64(pr.RowsEstimated))
	}
	eta := "?"
	if frac > 0.01 {
		eta = (time.Duration(float64(pr.Elapsed)/frac) - pr.Elapsed).Round(time.Second).String()
	}
	if !p.tty {
		fmt.Fprintf(p.w, "run %s: %d/%d tables, %d chunks, %d rows (%.0f%%), %d differences, elapsed %s, eta %s\n",
			pr.RunID, pr.TablesDone, pr.Tables, pr.ChunksDone, pr.RowsChecked, frac*100, pr.Differences,
			pr.Elapsed.Round(time.Second), eta)
		return
	}
	const width = 30
	n := int(frac * width)
	bar := strings.Repeat("█", n) + strings.Repeat("░", width-n)
	fmt.Fprintf(p.w, "\r\033[K%s %3.0f%%  %d/%d tables  %d rows  %d diffs  ETA %s", bar, frac*100,
		pr.TablesDone, pr.Tables, pr.RowsChecked, pr.Differences, eta)
	p.drawn = true
}

func (p *progressPrinter) finish() {
	if p.tty && p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// tsoTime renders the physical time of a TSO as " (2006-01-02 15:04:05.000 UTC)", or ""
// for a snapshot given as a datetime.
func tsoTime(snap string) string {
	ts, err := strconv.ParseUint(snap, 10, 64)
	if err != nil {
		return ""
	}
	return " (" + tso.Format(ts) + ")"
}

func printSummary(w io.Writer, rep *checker.Report, outDir string) {
	fmt.Fprintf(w, "parity diff run %s (%s)\n", rep.RunID, rep.FinishedAt.Sub(rep.StartedAt).Round(time.Millisecond))
	if rep.Scope != "" && rep.Scope != checker.ScopeFull {
		fmt.Fprintf(w, "  scope %s: the keys the changefeed changed (dirty-key ledger)\n", rep.Scope)
	}
	for _, s := range []struct{ side, snap string }{{"upstream", rep.UpstreamSnapshot}, {"downstream", rep.DownstreamSnapshot}} {
		if s.snap != "" {
			fmt.Fprintf(w, "  %s read at snapshot %s%s\n", s.side, s.snap, tsoTime(s.snap))
		}
	}
	for _, t := range rep.Tables {
		name := t.Schema + "." + t.Table
		if t.DownstreamSchema != t.Schema || t.DownstreamTable != t.Table {
			name += " -> " + t.DownstreamSchema + "." + t.DownstreamTable
		}
		status := "equal"
		switch {
		case !t.DataCompared:
			status = "NOT COMPARED"
		case t.DifferencesTotal > 0 || t.UndrilledChunks > 0:
			status = "DIFFERENT"
		case !t.StructureEqual:
			status = "STRUCTURE DIFFERS"
		}
		var kinds = map[checker.DiffKind]int{}
		for _, d := range t.Differences {
			kinds[d.Kind]++
		}
		fmt.Fprintf(w, "  %-18s %s: %d rows upstream, %d downstream, %d chunks, %d differences", status, name,
			t.RowsChecked, t.DownstreamRows, t.Chunks, t.DifferencesTotal)
		if t.DifferencesTotal > 0 {
			fmt.Fprintf(w, " (listed: %d missing, %d extra, %d differing)", kinds[checker.Missing], kinds[checker.Extra], kinds[checker.Differing])
		}
		fmt.Fprintln(w)
		switch t.Scope {
		case "keys":
			fmt.Fprintf(w, "      %d keys changed in (%d, %d]%s\n", t.ScopeKeys, t.ScopeFromTs, t.ScopeUntilTs, tsoTime(fmt.Sprint(t.ScopeUntilTs)))
		case "whole":
			fmt.Fprintf(w, "      compared whole: %s\n", t.ScopeNote)
		}
		if len(t.DifferencesByClass) > 0 {
			var cs []string
			for _, c := range []string{checker.ClassBypass, checker.ClassImported, checker.ClassPostImport, checker.ClassCDC, checker.ClassDiverged, checker.ClassUnclassified, checker.ClassInFlight} {
				if n := t.DifferencesByClass[c]; n > 0 {
					cs = append(cs, fmt.Sprintf("%d %s", n, c))
				}
			}
			fmt.Fprintf(w, "      classes: %s\n", strings.Join(cs, ", "))
		}
		if t.DifferencesResolved > 0 {
			fmt.Fprintf(w, "      %d rows that differed when first read were equal when read again (replication in flight); not counted above\n", t.DifferencesResolved)
		}
		if t.DifferencesUnconfirmed > 0 {
			fmt.Fprintf(w, "      %d rows that differed when first read were equal when read again at the same snapshot (a read that was not repeatable); not counted above\n", t.DifferencesUnconfirmed)
		}
		if t.UndrilledChunks > 0 {
			fmt.Fprintf(w, "      %d more chunks differ; their rows were not compared (max_differences reached), so the count, the list and the fix SQL are incomplete\n", t.UndrilledChunks)
		}
		for _, p := range t.StructureProblems {
			col := ""
			if p.Column != "" {
				col = "column " + p.Column + ": "
			}
			kind := "structure"
			if p.Warning {
				kind = "warning"
			}
			fmt.Fprintf(w, "      %s: %s%s\n", kind, col, p.Problem)
		}
		if t.FixSQLFile != "" {
			fmt.Fprintf(w, "      fix SQL: %s\n", outDir+string(os.PathSeparator)+t.FixSQLFile)
		}
	}
	if outDir != "" {
		fmt.Fprintf(w, "report: %s%sreport.json\n", outDir, string(os.PathSeparator))
	}
	if rep.Equal {
		fmt.Fprintln(w, "result: EQUAL")
		return
	}
	fmt.Fprintln(w, "result: DIFFERENCES FOUND")
	if c := rep.Classification; c != nil {
		for _, n := range c.Notes {
			fmt.Fprintln(w, "classification:", n)
		}
	}
	dataDiffers := false
	for _, t := range rep.Tables {
		dataDiffers = dataDiffers || t.DifferencesTotal > 0 || t.UndrilledChunks > 0
	}
	if dataDiffers && (rep.UpstreamSnapshot == "" || rep.DownstreamSnapshot == "") {
		// Without a snapshot on both sides, a row written during the run (replication in
		// flight) shows as a difference.
		if rep.RecheckRounds > 0 {
			fmt.Fprintf(w, "note: the sides were not both read at a snapshot; the differing rows were read again (%d round(s)) and still differed, but a row that replication keeps changing can still show as a difference: compare again (or at a snapshot) before acting on the fix SQL\n", rep.RecheckRounds)
		} else {
			fmt.Fprintln(w, "note: the sides were not both read at a snapshot: a row that replication changed during the run shows as a difference; compare again (or at a snapshot) before acting on the fix SQL")
		}
	}
}

// changefeedLag returns a reader of the lag of the changefeed named in cfg, from parity
// serve's meta schema on the downstream, over a connection of its own.
func changefeedLag(cfg checker.Config) (func(context.Context) (time.Duration, error), func(), error) {
	db, err := sql.Open("mysql", cfg.Downstream.DSN)
	if err != nil {
		return nil, nil, fmt.Errorf("changefeed lag: %w", err)
	}
	db.SetMaxOpenConns(1)
	lag := func(ctx context.Context) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
		defer cancel()
		return cdc.CheckpointLag(ctx, db, cfg.Changefeed.MetaSchema, cfg.Changefeed.ID, time.Now())
	}
	return lag, func() { db.Close() }, nil
}

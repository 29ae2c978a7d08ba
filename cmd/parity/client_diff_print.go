package main

// client_diff_print.go prints the answers of the verification-run commands (parity diff
// get, watch, list, differences) for people: a run with its pairs and tables, its
// progress line, the list of runs, the differences. --json prints the messages instead.

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/internal/tso"
)

// diffProgress draws a watched run's progress: on a terminal one line redrawn in place
// (bar, percent, tables, chunks, rows/s, differences, ETA); otherwise a line an update.
type diffProgress struct {
	w     io.Writer
	tty   bool
	drawn bool
}

func (p *diffProgress) update(d *parityv1.Diff) {
	if isEnded(d.GetState()) {
		return // printDiff shows it
	}
	line := progressLine(d)
	if !p.tty {
		fmt.Fprintf(p.w, "%s %s\n", d.GetName(), line)
		return
	}
	const width = 30
	frac := progressFraction(d.GetProgress())
	n := int(frac * width)
	bar := strings.Repeat("█", n) + strings.Repeat("░", width-n)
	fmt.Fprintf(p.w, "\r\033[K%s %3.0f%%  %s", bar, frac*100, line)
	p.drawn = true
}

func (p *diffProgress) finish() {
	if p.tty && p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// progressFraction is how far a run is: by chunks when their total is known, else by
// tables.
func progressFraction(pr *parityv1.DiffProgress) float64 {
	switch {
	case pr.GetChunksTotal() > 0:
		return min(1, float64(pr.GetChunksDone())/float64(pr.GetChunksTotal()))
	case pr.GetTablesTotal() > 0:
		return min(1, float64(pr.GetTablesDone())/float64(pr.GetTablesTotal()))
	}
	return 0
}

// progressLine is a running run's progress in one line.
func progressLine(d *parityv1.Diff) string {
	if d.GetState() == parityv1.DiffState_DIFF_STATE_QUEUED {
		return "queued (waiting for a slot: verify.max-concurrent-runs)"
	}
	pr := d.GetProgress()
	var b strings.Builder
	fmt.Fprintf(&b, "%s: tables %d/%d", diffStateName(d.GetState()), pr.GetTablesDone(), pr.GetTablesTotal())
	if pr.GetCurrentTable() != "" {
		fmt.Fprintf(&b, " (%s)", pr.GetCurrentTable())
	}
	if pr.GetChunksTotal() > 0 {
		fmt.Fprintf(&b, ", chunks %d/%d", pr.GetChunksDone(), pr.GetChunksTotal())
	} else if pr.GetChunksDone() > 0 {
		fmt.Fprintf(&b, ", chunks %d", pr.GetChunksDone())
	}
	fmt.Fprintf(&b, ", %d rows, %.0f rows/s, %d differences", pr.GetRowsChecked(), pr.GetRowsPerSecond(), pr.GetDifferences())
	if pr.GetEta() != nil {
		fmt.Fprintf(&b, ", ETA %s", pr.GetEta().AsDuration().Round(time.Second))
	} else {
		b.WriteString(", ETA ?")
	}
	return b.String()
}

func diffStateName(s parityv1.DiffState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "DIFF_STATE_"))
}

func diffResultName(r parityv1.DiffResult) string {
	if r == parityv1.DiffResult_DIFF_RESULT_UNSPECIFIED {
		return "-"
	}
	return client.EnumName(r.String(), "DIFF_RESULT_")
}

func kindName(k parityv1.DifferenceKind) string {
	return client.EnumName(k.String(), "DIFFERENCE_KIND_")
}

// fmtByClass renders differences by class in a stable order: "cdc 2, diverged 1".
func fmtByClass(m map[string]int64) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

func printDiff(w io.Writer, d *parityv1.Diff) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "run:\t%s\n", d.GetRunId())
	fmt.Fprintf(tw, "trigger:\t%s (%s)", d.GetTrigger(), d.GetTriggerKind())
	if d.GetInstance() != "" {
		fmt.Fprintf(tw, " on %s", d.GetInstance())
	}
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "scope:\t%s over %s\n", d.GetScope(), strings.Join(d.GetTables(), ", "))
	fmt.Fprintf(tw, "state:\t%s\n", diffStateName(d.GetState()))
	if isEnded(d.GetState()) {
		fmt.Fprintf(tw, "result:\t%s\n", diffResultName(d.GetResult()))
	}
	if d.GetError() != "" {
		fmt.Fprintf(tw, "error:\t%s\n", d.GetError())
	}
	fmt.Fprintf(tw, "started:\t%s\n", fmtTime(d.GetCreateTime()))
	if d.GetEndTime() != nil {
		elapsed := ""
		if d.GetCreateTime() != nil {
			elapsed = fmt.Sprintf(" (%v)", d.GetEndTime().AsTime().Sub(d.GetCreateTime().AsTime()).Round(time.Millisecond))
		}
		fmt.Fprintf(tw, "ended:\t%s%s\n", fmtTime(d.GetEndTime()), elapsed)
	}
	if !isEnded(d.GetState()) && d.GetProgress() != nil {
		fmt.Fprintf(tw, "progress:\t%s\n", progressLine(d))
	}
	fmt.Fprintf(tw, "tables compared:\t%d\n", d.GetTablesCompared())
	fmt.Fprintf(tw, "rows checked:\t%d\n", d.GetRowsChecked())
	fmt.Fprintf(tw, "differences:\t%d\n", d.GetDifferences())
	if d.GetDifferences() > 0 || len(d.GetDifferencesByClass()) > 0 {
		fmt.Fprintf(tw, "by class:\t%s\n", fmtByClass(d.GetDifferencesByClass()))
	}
	if n := d.GetUnconfirmed(); n > 0 {
		fmt.Fprintf(tw, "unconfirmed:\t%d (different when first read at a pair, equal when read again at it: a store anomaly, not counted above)\n", n)
	}
	fmt.Fprintf(tw, "covers changes up to:\t%s\n", fmtTS(d.GetFirstTs()))
	if d.GetMaxPause() != nil {
		fmt.Fprintf(tw, "longest pause:\t%s\n", fmtDur(d.GetMaxPause()))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(d.GetPairs()) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PAIR\tUPSTREAM TS\tDOWNSTREAM POSITION\tPAUSE")
		for i, p := range d.GetPairs() {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", i, fmtTS(p.GetTs()), p.GetDownstreamPosition(), fmtDur(p.GetPause()))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(d.GetTableResults()) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		// A scoped run says, per table, what it compared and whether the writes that
		// bypassed parity were among its keys.
		scoped := slices.ContainsFunc(d.GetTableResults(), func(t *parityv1.TableResult) bool { return t.GetScope() == "keys" || t.GetScope() == "whole" })
		if scoped {
			fmt.Fprintln(tw, "TABLE\tRESULT\tROWS\tDIFFERENCES\tPAIRS\tSCOPE\tKEYS\tBYPASS\tBYPASS KEYS")
		} else {
			fmt.Fprintln(tw, "TABLE\tRESULT\tROWS\tDIFFERENCES\tPAIRS")
		}
		var notes []string
		for _, t := range d.GetTableResults() {
			pairs := make([]string, len(t.GetPairs()))
			for i, p := range t.GetPairs() {
				pairs[i] = strconv.Itoa(int(p))
			}
			res := t.GetResult()
			if t.GetError() != "" {
				res += ": " + t.GetError()
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s", t.GetTable(), res, t.GetRowsChecked(), t.GetDifferences(), strings.Join(pairs, ","))
			if scoped {
				bypass := t.GetBypass()
				if bypass == "" {
					bypass = "-"
				}
				fmt.Fprintf(tw, "\t%s\t%d\t%s\t%d", orDash(t.GetScope()), t.GetScopeKeys(), bypass, t.GetBypassKeys())
				if t.GetBypassNote() != "" {
					notes = append(notes, t.GetTable()+": "+t.GetBypassNote())
				}
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(notes) > 0 {
			fmt.Fprintln(w, "\nnot vouched for (writes straight into the fallback):")
			for _, n := range notes {
				fmt.Fprintf(w, "  - %s\n", n)
			}
		}
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printDiffList(w io.Writer, diffs []*parityv1.Diff) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tTRIGGER\tSCOPE\tSTATE\tRESULT\tSTARTED\tELAPSED\tPAIRS\tTABLES\tROWS\tDIFFERENCES\tMAX PAUSE\tNOTE")
	for _, d := range diffs {
		elapsed := "-"
		if d.GetEndTime() != nil && d.GetCreateTime() != nil {
			elapsed = d.GetEndTime().AsTime().Sub(d.GetCreateTime().AsTime()).Round(time.Millisecond).String()
		}
		started := "-"
		if d.GetCreateTime() != nil {
			started = d.GetCreateTime().AsTime().UTC().Format("2006-01-02 15:04:05")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", d.GetRunId(), d.GetTrigger(), d.GetScope(),
			diffStateName(d.GetState()), diffResultName(d.GetResult()), started, elapsed, len(d.GetPairs()), d.GetTablesCompared(),
			d.GetRowsChecked(), d.GetDifferences(), fmtDur(d.GetMaxPause()), d.GetError())
	}
	return tw.Flush()
}

func printDifferences(w io.Writer, diffs []*parityv1.Difference, total int64) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TABLE\tKIND\tCLASS\tKEY\tCOLUMNS\tCOUNT")
	for _, d := range diffs {
		cols := strings.Join(d.GetColumns(), ",")
		if cols == "" {
			cols = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", d.GetTable(), kindName(d.GetKind()), d.GetClass(), d.GetKey(), cols, d.GetCount())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d of %d differences\n", len(diffs), total)
	return err
}

func fmtTS(ts uint64) string {
	if ts == 0 {
		return "-"
	}
	return fmt.Sprintf("%d (%s)", ts, tso.Format(ts))
}

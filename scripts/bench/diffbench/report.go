package main

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"
)

func secs(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func rss(kb int64) string {
	if kb == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f MiB", float64(kb)/1024)
}

func ratio(a, b time.Duration) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// printResults prints the measurements and the targets of issue 5 with PASS/MISS.
func printResults(w io.Writer, o options, results []*caseResult) {
	if len(results) == 0 {
		return
	}
	fmt.Fprintf(w, "\n== diff benchmark: %d-row sbtest1, differences case = %d changed + %d missing + %d extra ==\n",
		o.rows, o.changed, o.missing, o.extra)
	args := o.parityArgs
	if args == "" {
		args = "(default flags)"
	}
	fmt.Fprintf(w, "host: %d CPUs, load average at start %s; parity diff %s; reladiff --threads %d; bare loop concurrency %d; fastest of %d run(s) per tool\n",
		runtime.NumCPU(), o.loadavg, args, o.threads, o.concurrency, max(o.repeat, 1))
	if o.reladiffStart > 0 {
		fmt.Fprintf(w, "reladiff's times include its interpreter start (`reladiff --version`: %s)\n", secs(o.reladiffStart))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "pair\tcase\ttool\twall\tmax RSS\tchunks\tdifferences found\tnote")
	for _, r := range results {
		for _, t := range []struct {
			name string
			res  Result
		}{{"parity", r.parity}, {"reladiff", r.reladiff}, {"bare loop", r.floor}, {"read bound", r.readBound}, {"crc32 bound", r.crcBound}} {
			if t.res.Wall == 0 && strings.HasSuffix(t.name, " bound") {
				continue
			}
			found := "-"
			if (t.name == "parity" || t.name == "reladiff") && t.res.Wall > 0 {
				found = kindCounts(t.res.Found)
			}
			chunks := "-"
			if t.res.Chunks > 0 {
				chunks = fmt.Sprint(t.res.Chunks)
			}
			note := t.res.Note
			if t.res.CPU > 0 {
				note = strings.TrimSuffix(fmt.Sprintf("own CPU %.2f s; %s", t.res.CPU.Seconds(), note), "; ")
			}
			if len(t.res.Runs) > 1 {
				var rs []string
				for _, d := range t.res.Runs {
					rs = append(rs, fmt.Sprintf("%.2f", d.Seconds()))
				}
				note = strings.TrimSuffix("runs "+strings.Join(rs, "/")+" s; "+note, "; ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.pair.label, r.name, t.name, secs(t.res.Wall), rss(t.res.MaxRSSKB), chunks, found, note)
		}
	}
	tw.Flush()

	fmt.Fprintln(w, "\n== targets ==")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "pair\tcase\ttarget\tmeasured\tresult")
	for _, r := range results {
		target := r.pair.targetSame
		if len(r.want) > 0 {
			target = r.pair.targetDiff
		}
		if r.parity.Wall > 0 && r.reladiff.Wall > 0 {
			x := ratio(r.reladiff.Wall, r.parity.Wall)
			fmt.Fprintf(tw, "%s\t%s\tparity >= %.0fx faster than reladiff\t%.2fx (%s vs %s)\t%s\n", r.pair.label, r.name, target, x,
				secs(r.parity.Wall), secs(r.reladiff.Wall), verdict(x >= target))
		} else {
			verdict := "MISS"
			if o.noReladiff {
				verdict = "skipped (-no-reladiff)"
			}
			fmt.Fprintf(tw, "%s\t%s\tparity >= %.0fx faster than reladiff\tnot measured\t%s\n", r.pair.label, r.name, target, verdict)
		}
		for _, b := range []struct {
			name string
			res  Result
		}{{"reading every compared column, no hash (read bound)", r.readBound}, {"a 32-bit CRC32 per row (crc32 bound)", r.crcBound}} {
			if b.res.Wall > 0 && r.reladiff.Wall > 0 {
				x := ratio(r.reladiff.Wall, b.res.Wall)
				fmt.Fprintf(tw, "%s\t%s\t(info) reladiff against the bare loop %s\t%.2fx (%s vs %s)\t%s\n", r.pair.label, r.name, b.name, x,
					secs(b.res.Wall), secs(r.reladiff.Wall), map[bool]string{true: "above target", false: "below target"}[x >= target])
			}
		}
		if r.parity.Wall > 0 && r.floor.Wall > 0 {
			x := ratio(r.parity.Wall, r.floor.Wall)
			fmt.Fprintf(tw, "%s\t%s\tparity within %.1fx of the bare checksum loop\t%.2fx (%s vs %s)\t%s\n", r.pair.label, r.name, targetFloor, x,
				secs(r.parity.Wall), secs(r.floor.Wall), verdict(x <= targetFloor))
		} else {
			fmt.Fprintf(tw, "%s\t%s\tparity within %.1fx of the bare checksum loop\tnot measured\tMISS\n", r.pair.label, r.name, targetFloor)
		}
		if r.parity.Wall > 0 {
			ok, detail := compareFound(r.want, r.parity.Found)
			if r.parity.Err != nil {
				ok, detail = false, r.parity.Err.Error()
			}
			if detail == "" {
				detail = "exactly the injected rows, kinds and columns"
			}
			fmt.Fprintf(tw, "%s\t%s\tparity finds exactly the %d injected differences\t%s: %s\t%s\n", r.pair.label, r.name, len(r.want),
				kindCounts(r.parity.Found), detail, verdict(ok))
		}
		if r.fixOK != nil {
			fmt.Fprintf(tw, "%s\t%s\tparity's fix SQL makes the downstream equal\t%s\t%s\n", r.pair.label, r.name, r.fixNote, verdict(*r.fixOK))
		}
		if r.reladiff.Wall > 0 {
			ok, detail := compareFound(r.want, r.reladiff.Found)
			if detail == "" {
				detail = "exactly the injected rows"
			}
			fmt.Fprintf(tw, "%s\t%s\t(info) what reladiff found\t%s: %s\t%s\n", r.pair.label, r.name,
				kindCounts(r.reladiff.Found), detail, map[bool]string{true: "correct", false: "wrong"}[ok])
		}
	}
	tw.Flush()
	var rs []string
	for _, r := range results {
		if r.parity.MaxRSSKB > 0 {
			rs = append(rs, fmt.Sprintf("%s/%s parity %s reladiff %s", r.pair.name, r.name, rss(r.parity.MaxRSSKB), rss(r.reladiff.MaxRSSKB)))
		}
	}
	if len(rs) > 0 {
		fmt.Fprintln(w, "\nmax RSS: "+strings.Join(rs, "; "))
	}
}

package checker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/metaschema"
)

// TestResumeOldFormatRun resumes a run that the previous release (0d2dbf4) stored and
// that stopped part-way: checker/testdata/oldrun/run.json holds its meta rows as that
// release wrote them (write_old_run.go.txt there made it), on dataset.sql's tables.
// Those rows hold chunk bounds as JSON and differences' keys as SQL literals only; this
// release stores rowkey.Keys (keys.go). The resumed run must compare the chunks left
// (cut from the old bounds), re-check the differences the old release stored (read back
// by their literals: a composite key of general_ci text with a quote and a tab, BIGINT
// UNSIGNED beyond 2^63, negative DECIMAL, DATETIME(3) and VARBINARY with zero bytes, and
// a keyless table's rows with NULLs and floats), resolve the one repaired since, and
// report exactly what a new run of this release reports on the same data: the same
// differences (kinds, key literals, columns), counts and fix SQL, which applied makes
// the tables equal.
func TestResumeOldFormatRun(t *testing.T) {
	p := mariaPair(t)
	data, err := os.ReadFile(filepath.Join("testdata", "oldrun", "dataset.sql"))
	if err != nil {
		t.Fatal(err)
	}
	sections := datasetSections(string(data))
	p.both(t, sections["both"]...)
	exec(t, p.up.DB, sections["upstream"]...)
	exec(t, p.down.DB, sections["downstream"]...)

	// The old run's rows, under a new run ID and this test's schema names.
	var fixture struct {
		Tables map[string][]map[string]*string `json:"tables"`
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "oldrun", "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &fixture); err != nil {
		t.Fatal(err)
	}
	var id [6]byte
	_, _ = rand.Read(id[:])
	runID := "oldrun-" + hex.EncodeToString(id[:])
	names := strings.NewReplacer("{{RUN}}", runID, "{{UP}}", p.up.Name, "{{DOWN}}", p.down.Name)
	cfg := DefaultConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := metaschema.Migrate(ctx, p.down.DB, cfg.MetaSchema, time.Minute); err != nil {
		t.Fatal(err)
	}
	var oldBounds, oldKeys int // stored in the old forms, for chunks left to compare and differences
	for _, table := range []string{"diff_runs", "diff_tables", "diff_chunks", "diff_differences", "diff_difference_parts", "diff_rechecks"} {
		for _, row := range fixture.Tables[table] {
			var cols, marks []string
			var args []any
			for c, v := range row {
				cols, marks = append(cols, c), append(marks, "?")
				if v == nil {
					args = append(args, nil)
				} else {
					args = append(args, names.Replace(*v))
				}
			}
			if _, err := p.down.ExecContext(ctx, "INSERT INTO "+metaTable(table)+" ("+strings.Join(cols, ", ")+") VALUES ("+strings.Join(marks, ", ")+")", args...); err != nil {
				t.Fatalf("load %s: %v", table, err)
			}
			switch {
			case table == "diff_chunks" && *row["state"] != chunkDone && strings.HasPrefix(*row["hi_bound"], "["):
				oldBounds++
			case table == "diff_differences" && !strings.Contains(*row["diff"], `"rk"`):
				oldKeys++
			}
		}
	}
	if oldBounds == 0 || oldKeys < 10 || *fixture.Tables["diff_runs"][0]["state"] != RunCancelled {
		t.Fatalf("the fixture does not hold an unfinished old-format run: %d JSON bounds of chunks left, %d literal-only keys", oldBounds, oldKeys)
	}
	// Repaired after the old run stored it as a difference.
	exec(t, p.down.DB, sections["repair"]...)

	tables := []string{"a_keyless", "ck", "ik"}
	config := func() Config {
		c := p.config(t, tables...)
		c.InitialChunkRows, c.MinChunkRows, c.MaxChunkRows = 100, 100, 100
		return c
	}
	resumedCfg := config()
	resumedCfg.Resume = runID
	resumed, err := NewDiff(resumedCfg, nil).Run(ctx)
	if err != nil {
		t.Fatalf("resume the old run: %v", err)
	}
	freshCfg := config()
	fresh := run(t, freshCfg)
	if resumed.RunID != runID || resumed.RecheckRounds != 1 {
		t.Errorf("resumed run %s, %d re-check rounds", resumed.RunID, resumed.RecheckRounds)
	}

	entries := func(tr TableReport) []string {
		var out []string
		for _, d := range tr.Differences {
			b, _ := json.Marshal(d)
			out = append(out, string(b))
		}
		slices.Sort(out)
		return out
	}
	// Both runs read the sides live and re-check: what is left has diverged.
	want := map[string][]string{
		"a_keyless": {
			`{"kind":"extra","key":{"x":"7","y":"NULL","f":"2.333333333333333e+19"},"class":"diverged"}`,
			`{"kind":"extra","key":{"x":"9","y":"'y9'","f":"3e+19"},"class":"diverged"}`,
			`{"kind":"missing","key":{"x":"3","y":"NULL","f":"1e+21"},"class":"diverged"}`,
			`{"kind":"missing","key":{"x":"4","y":"_utf8mb4 X'69742773'","f":"-1e-06"},"class":"diverged"}`,
			`{"kind":"missing","key":{"x":"9","y":"'y9'","f":"2.5"},"class":"diverged"}`,
		},
		"ck": {
			`{"kind":"differing","key":{"a":"'k0123'","b":"123","c":"-69.25","d":"'2024-03-01 00:02:02.500'","e":"X'00035D'"},"columns":["v"],"class":"diverged"}`,
			`{"kind":"differing","key":{"a":"'k1700'","b":"18446744073709549915","c":"325.00","d":"'2024-03-01 00:28:19.500'","e":"X'002E7C'"},"columns":["v"],"class":"diverged"}`,
			`{"kind":"differing","key":{"a":"'Ésa'","b":"5","c":"0.50","d":"'2000-01-01 00:00:00.000'","e":"X'00'"},"columns":["v"],"class":"diverged"}`,
			`{"kind":"differing","key":{"a":"_utf8mb4 X'6F276B'","b":"9223372036854775808","c":"-0.01","d":"'1999-12-31 23:59:59.999'","e":"X'27'"},"columns":["v"],"class":"diverged"}`,
			`{"kind":"extra","key":{"a":"'k0300x'","b":"1","c":"1.00","d":"'2024-01-01 00:00:00.000'","e":"X'01'"},"class":"diverged"}`,
			`{"kind":"extra","key":{"a":"'zzz'","b":"2","c":"2.00","d":"'2024-01-01 00:00:00.000'","e":"X'02'"},"class":"diverged"}`,
			`{"kind":"missing","key":{"a":"'k0050'","b":"18446744073709551565","c":"-87.50","d":"'2024-03-01 00:00:49.500'","e":"X'00015E'"},"class":"diverged"}`,
			`{"kind":"missing","key":{"a":"'k1500'","b":"18446744073709550115","c":"275.00","d":"'2024-03-01 00:24:59.500'","e":"X'002904'"},"class":"diverged"}`,
			`{"kind":"missing","key":{"a":"_utf8mb4 X'7461620968657265'","b":"0","c":"999999.99","d":"'2038-01-19 03:14:07.000'","e":"''"},"class":"diverged"}`,
		},
		"ik": {
			`{"kind":"differing","key":{"id":"1500"},"columns":["v"],"class":"diverged"}`,
			`{"kind":"extra","key":{"id":"5000"},"class":"diverged"}`,
			`{"kind":"missing","key":{"id":"-900"},"class":"diverged"}`,
		},
	}
	for _, name := range tables {
		r, f := tableReport(t, resumed, name), tableReport(t, fresh, name)
		if got := entries(r); !slices.Equal(got, want[name]) {
			t.Errorf("%s: resumed run reports\n%s\nwant\n%s", name, strings.Join(got, "\n"), strings.Join(want[name], "\n"))
		}
		if got := entries(f); !slices.Equal(got, want[name]) {
			t.Errorf("%s: new run reports\n%s\nwant\n%s", name, strings.Join(got, "\n"), strings.Join(want[name], "\n"))
		}
		if r.DifferencesTotal != f.DifferencesTotal || r.RowsChecked != f.RowsChecked || r.DownstreamRows != f.DownstreamRows {
			t.Errorf("%s: resumed run counts %d differences in %d/%d rows, new run %d in %d/%d", name,
				r.DifferencesTotal, r.RowsChecked, r.DownstreamRows, f.DifferencesTotal, f.RowsChecked, f.DownstreamRows)
		}
		wantResolved := int64(0)
		if name == "ck" {
			wantResolved = 1 // k0400, repaired after the old run stored it
		}
		if r.DifferencesResolved != wantResolved || f.DifferencesResolved != 0 {
			t.Errorf("%s: resolved %d by the resumed run (want %d), %d by the new one", name, r.DifferencesResolved, wantResolved, f.DifferencesResolved)
		}
		// The same fix statements (in another order: the runs cut other chunks).
		statements := func(c Config, tr TableReport) []string {
			var out []string
			for _, l := range strings.Split(readFix(t, c, tr), "\n") {
				if !strings.HasPrefix(l, "-- parity diff run ") {
					out = append(out, l)
				}
			}
			slices.Sort(out)
			return out
		}
		if a, b := statements(resumedCfg, r), statements(freshCfg, f); !slices.Equal(a, b) {
			t.Errorf("%s: fix SQL of the resumed run\n%s\nof a new run\n%s", name, strings.Join(a, "\n"), strings.Join(b, "\n"))
		}
	}

	// What the resumed run stored is in this release's forms, beside the old bounds.
	var newBounds, keyed, all int
	if err := p.down.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+metaTable("diff_chunks")+" WHERE run_id = ? AND hi_bound LIKE 'rk:%'", runID).Scan(&newBounds); err != nil {
		t.Fatal(err)
	}
	if err := p.down.QueryRowContext(ctx, "SELECT SUM(diff LIKE '%\"rk\":%'), COUNT(*) FROM "+metaTable("diff_differences")+" WHERE run_id = ?", runID).Scan(&keyed, &all); err != nil {
		t.Fatal(err)
	}
	if newBounds == 0 || keyed != all || all != 17 {
		t.Errorf("after the resume: %d chunks cut with rowkey bounds, %d of %d differences stored with rowkeys (want all 17)", newBounds, keyed, all)
	}

	// The fix SQL is executable and complete.
	for _, name := range tables {
		applyFix(t, p.down.DB, readFix(t, resumedCfg, tableReport(t, resumed, name)))
	}
	if rep := run(t, config()); !rep.Equal {
		for _, tr := range rep.Tables {
			t.Errorf("%s after the fix: %d differences", tr.Table, tr.DifferencesTotal)
		}
	}
}

// datasetSections splits testdata/oldrun/dataset.sql into its sections' statements.
func datasetSections(text string) map[string][]string {
	out := map[string][]string{}
	section := ""
	for _, stmt := range strings.Split(text, ";\n") {
		var body []string
		for _, line := range strings.Split(stmt, "\n") {
			if name, ok := strings.CutPrefix(line, "-- "); ok && !strings.Contains(name, " ") {
				section = name
			} else if !strings.HasPrefix(line, "--") {
				body = append(body, line)
			}
		}
		if s := strings.TrimSpace(strings.Join(body, "\n")); s != "" {
			out[section] = append(out[section], s)
		}
	}
	return out
}

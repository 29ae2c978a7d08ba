package e2e

// upgrade_diff_test.go is the diff half of TestUpgradeInPlace (upgradeDiff): the old
// release's `parity diff` finishes one run and is killed in another, then this tree's
// binary resumes both; and the reading and checking of the runs' JSON reports.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// upgradeDiff is the diff half: a database of the same name on the peer MariaDB
// (upstream) and the fallback (downstream, which also holds the meta schema).
type upgradeDiff struct {
	t          *testing.T
	e          *env
	bin        string // the parity binary the next command runs
	dir        string
	db         string
	upDSN      string
	downDSN    string
	down       *sql.DB
	meta       *sql.DB
	config     string            // TOML with meta_schema: the one setting without a flag
	finishedID string            // the run the old binary finished (with a resolved re-check)
	killedID   string            // the run the old binary was killed in
	killedDone map[string]string // its chunks done at the kill: "table/seq" → attempts and time
}

// The killed run's tables with their upstream rows, and the differences planted
// downstream as the report lists them: "kind col=value,... [differing columns]".
var (
	upgradeDiffRows = map[string]int64{"c": 6000, "k": 300, "t": 24000}
	upgradeDiffWant = map[string][]string{
		"c": {"differing g='g003',n=7 [v]", "missing g='g050',n=50"},
		"k": {"extra a=7,b='x'"},
		"t": {"differing id=12345 [d]", "differing id=5 [v]", "extra id=24005", "missing id=23990"},
	}
)

func newUpgradeDiff(t *testing.T, e *env, bin, dir string) *upgradeDiff {
	t.Helper()
	d := &upgradeDiff{t: t, e: e, bin: bin, dir: dir, db: testenv.UniqueName("pupg"),
		upDSN: testenv.Require(t, testenv.EnvMySQL), downDSN: e.downDSN}
	up := e.open(d.upDSN, "")
	d.down, d.meta = e.open(d.downDSN, ""), e.open(d.downDSN, "")
	q := ident.Quote(d.db)
	for _, db := range []*sql.DB{up, d.down} {
		d.exec(db, "CREATE DATABASE "+q)
		t.Cleanup(func() {
			if os.Getenv("PARITY_TEST_KEEP") != "1" {
				_, _ = db.Exec("DROP DATABASE IF EXISTS " + q)
			}
		})
		for _, s := range []string{
			"CREATE TABLE %[1]s.t (id INT PRIMARY KEY, v VARCHAR(32) NOT NULL, d DECIMAL(12,2), at DATETIME)",
			"INSERT INTO %[1]s.t SELECT seq, CONCAT('v', seq), seq / 7, '2026-01-01' + INTERVAL seq MINUTE FROM %[1]s.seq_1_to_24000",
			"CREATE TABLE %[1]s.c (g VARCHAR(16) NOT NULL, n INT NOT NULL, v VARCHAR(32), PRIMARY KEY (g, n))",
			"INSERT INTO %[1]s.c SELECT CONCAT('g', LPAD(seq DIV 100, 3, '0')), seq MOD 100, CONCAT('c', seq) FROM %[1]s.seq_0_to_5999",
			"CREATE TABLE %[1]s.k (a INT NOT NULL, b VARCHAR(10))",
			"INSERT INTO %[1]s.k SELECT seq MOD 50, 'x' FROM %[1]s.seq_1_to_300",
			"CREATE TABLE %[1]s.r (id INT PRIMARY KEY, v VARCHAR(32))",
			"INSERT INTO %[1]s.r SELECT seq, CONCAT('r', seq) FROM %[1]s.seq_1_to_200",
		} {
			d.exec(db, fmt.Sprintf(s, q))
		}
	}
	for _, s := range []string{
		"UPDATE %[1]s.t SET v = 'changed' WHERE id = 5",
		"UPDATE %[1]s.t SET d = d + 1 WHERE id = 12345",
		"DELETE FROM %[1]s.t WHERE id = 23990",
		"INSERT INTO %[1]s.t VALUES (24005, 'extra', 1, NULL)",
		"UPDATE %[1]s.c SET v = 'changed' WHERE g = 'g003' AND n = 7",
		"DELETE FROM %[1]s.c WHERE g = 'g050' AND n = 50",
		"INSERT INTO %[1]s.k VALUES (7, 'x')",
		"UPDATE %[1]s.r SET v = 'in flight' WHERE id = 3",
		"UPDATE %[1]s.r SET v = 'changed' WHERE id = 9",
	} {
		d.exec(d.down, fmt.Sprintf(s, q))
	}
	d.config = filepath.Join(dir, "diff.toml")
	// meta_schema has no flag; the previous release reads only this snake_case spelling.
	if err := os.WriteFile(d.config, []byte(fmt.Sprintf("meta_schema = %q\n", e.meta)), 0o644); err != nil {
		t.Fatal(err)
	}
	return d
}

func (d *upgradeDiff) exec(db *sql.DB, q string) {
	d.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, q); err != nil {
		d.t.Fatalf("%s: %v", q, err)
	}
}

// table names a diff table of the meta schema as the previous release created it.
func (d *upgradeDiff) table(name string) string { return ident.Table(d.e.meta, name) }

func (d *upgradeDiff) count(q string, args ...any) int {
	d.t.Helper()
	return int(queryUint(d.t, d.meta, q, args...))
}

// diffProc is a running `parity diff`.
type diffProc struct {
	cmd     *exec.Cmd
	out     string // --output
	logPath string
	done    chan struct{}
	err     error // valid after done
}

// start starts d.bin's `parity diff` with the flags both releases take.
func (d *upgradeDiff) start(name string, tables []string, extra ...string) *diffProc {
	d.t.Helper()
	p := &diffProc{out: filepath.Join(d.dir, name), logPath: filepath.Join(d.dir, name+".log"), done: make(chan struct{})}
	args := []string{"diff", "--config", d.config, "--upstream", d.upDSN, "--downstream", d.downDSN, "--output", p.out}
	for _, tb := range tables {
		args = append(args, "--table", d.db+"."+tb)
	}
	p.cmd = exec.Command(d.bin, append(args, extra...)...)
	logf, err := os.Create(p.logPath)
	if err != nil {
		d.t.Fatal(err)
	}
	defer logf.Close()
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	d.t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.done })
	return p
}

// wait waits for the command, logs its output and returns its exit code.
func (d *upgradeDiff) wait(p *diffProc) int {
	d.t.Helper()
	select {
	case <-p.done:
	case <-time.After(2 * time.Minute):
		d.t.Fatalf("%s did not end within 2 minutes", p.logPath)
	}
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		d.t.Fatal(p.err)
	}
	log, _ := os.ReadFile(p.logPath)
	d.t.Logf("%s (%s):\n%s", filepath.Base(p.logPath), d.bin, log)
	return p.cmd.ProcessState.ExitCode()
}

// poll checks cond every 20ms for up to a minute; the diff must not end meanwhile.
func (d *upgradeDiff) poll(p *diffProc, what string, cond func() bool) {
	d.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		select {
		case <-p.done:
			log, _ := os.ReadFile(p.logPath)
			d.t.Fatalf("parity diff ended (%v) before %s:\n%s", p.err, what, log)
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("parity diff: no %s within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runFinished: the old binary compares r with a 4s re-check delay; once its chunks are
// stored done, id 3 is repaired downstream as replication would repair it, so the
// finished run reports id 9 and one difference resolved by its re-check.
func (d *upgradeDiff) runFinished() {
	t := d.t
	p := d.start("finished-old", []string{"r"}, "--recheck-delay", "4s")
	var runID string
	d.poll(p, "the finished run's chunks done", func() bool {
		if runID == "" {
			if d.count("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'diff_runs'", d.e.meta) == 0 {
				return false
			}
			queryRows(t, d.meta, "SELECT run_id FROM "+d.table("diff_runs"), func(r *sql.Rows) error { return r.Scan(&runID) })
			if runID == "" {
				return false
			}
		}
		split := d.count("SELECT COUNT(*) FROM "+d.table("diff_tables")+" WHERE run_id = ? AND split_done = 1", runID)
		undone := d.count("SELECT COUNT(*) FROM "+d.table("diff_chunks")+" WHERE run_id = ? AND state <> 'done'", runID)
		return split == 1 && undone == 0
	})
	d.exec(d.down, "UPDATE "+ident.Table(d.db, "r")+" SET v = 'r3' WHERE id = 3")
	if code := d.wait(p); code != 1 {
		t.Fatalf("old parity diff of r: exit %d, want 1 (differences)", code)
	}
	d.finishedID = runID
	rep := readDiffReport(t, p.out)
	checkReport(t, "old release, finished run", rep, runID, map[string][]string{"r": {"differing id=9 [v]"}}, map[string]int64{"r": 200})
	if tb := rep.table("r"); tb == nil || tb.DifferencesResolved != 1 {
		t.Fatalf("old release, finished run: want 1 difference resolved by the re-check (id 3 repaired before it): %+v", tb)
	}
}

// runKilled: the old binary compares t, c and k at 3,000 rows/s and is SIGKILLed once
// t's first chunk and at least 6 chunks are stored done; then a row of that first chunk
// changes downstream, which the resumed run must not compare again.
func (d *upgradeDiff) runKilled() {
	t := d.t
	p := d.start("killed-old", []string{"t", "c", "k"}, "--max-rows-per-second", "3000", "--concurrency", "2")
	var runID string
	tIdx := -1
	d.poll(p, "6 chunks stored done", func() bool {
		if runID == "" {
			queryRows(t, d.meta, "SELECT run_id FROM "+d.table("diff_runs")+" WHERE run_id <> ?", func(r *sql.Rows) error { return r.Scan(&runID) }, d.finishedID)
			if runID == "" {
				return false
			}
		}
		if tIdx < 0 {
			queryRows(t, d.meta, "SELECT table_idx FROM "+d.table("diff_tables")+" WHERE run_id = ? AND up_table = 't'", func(r *sql.Rows) error { return r.Scan(&tIdx) }, runID)
			if tIdx < 0 {
				return false
			}
		}
		first := d.count("SELECT COUNT(*) FROM "+d.table("diff_chunks")+" WHERE run_id = ? AND table_idx = ? AND seq = 0 AND state = 'done'", runID, tIdx)
		return first == 1 && d.count("SELECT COUNT(*) FROM "+d.table("diff_chunks")+" WHERE run_id = ? AND state = 'done'", runID) >= 6
	})
	_ = p.cmd.Process.Kill()
	<-p.done
	d.killedID = runID
	if n := d.count("SELECT COUNT(*) FROM "+d.table("diff_runs")+" WHERE run_id = ? AND state = 'running'", runID); n != 1 {
		t.Fatalf("run %s was not left running by the kill: it ended before it", runID)
	}
	d.killedDone = d.doneChunks(runID)
	total := d.count("SELECT COUNT(*) FROM "+d.table("diff_chunks")+" WHERE run_id = ?", runID)
	stored := d.count("SELECT COUNT(*) FROM "+d.table("diff_differences")+" WHERE run_id = ?", runID)
	t.Logf("old run %s killed with %d of its %d stored chunks done and %d differences stored", runID, len(d.killedDone), total, stored)
	d.exec(d.down, "UPDATE "+ident.Table(d.db, "t")+" SET v = 'after the kill' WHERE id = 2")
}

// doneChunks returns the run's done chunks: "table/seq" → attempts and update time.
func (d *upgradeDiff) doneChunks(runID string) map[string]string {
	out := map[string]string{}
	queryRows(d.t, d.meta, "SELECT table_idx, seq, attempts, updated_at FROM "+d.table("diff_chunks")+" WHERE run_id = ? AND state = 'done'",
		func(r *sql.Rows) error {
			var idx, seq, attempts int
			var at string
			err := r.Scan(&idx, &seq, &attempts, &at)
			out[fmt.Sprintf("%d/%d", idx, seq)] = fmt.Sprintf("attempts %d, updated %s", attempts, at)
			return err
		}, runID)
	return out
}

// resumeKilled: d.bin continues the killed run.
func (d *upgradeDiff) resumeKilled() {
	t := d.t
	p := d.start("killed-new", []string{"t", "c", "k"}, "--concurrency", "2", "--resume", d.killedID)
	if code := d.wait(p); code != 1 {
		t.Fatalf("parity diff --resume %s: exit %d, want 1 (differences)", d.killedID, code)
	}
	checkReport(t, "resuming the killed run", readDiffReport(t, p.out), d.killedID, upgradeDiffWant, upgradeDiffRows)
	now := d.doneChunks(d.killedID)
	redone := 0
	for k, was := range d.killedDone {
		if now[k] != was {
			t.Errorf("chunk %s, done by the old release (%s), is now %q: compared again", k, was, now[k])
			redone++
		}
	}
	t.Logf("resumed run: %d chunks done, %d of them by the old release, %d of those compared again", len(now), len(d.killedDone), redone)
}

// resumeFinished: --resume of the finished run reports what the old release reported.
func (d *upgradeDiff) resumeFinished() {
	t := d.t
	p := d.start("finished-new", []string{"r"}, "--resume", d.finishedID)
	if code := d.wait(p); code != 1 {
		t.Fatalf("parity diff --resume %s (finished): exit %d, want 1", d.finishedID, code)
	}
	rep := readDiffReport(t, p.out)
	checkReport(t, "resuming the finished run", rep, d.finishedID, map[string][]string{"r": {"differing id=9 [v]"}}, map[string]int64{"r": 200})
	if tb := rep.table("r"); tb != nil && tb.DifferencesResolved != 1 {
		t.Errorf("resuming the finished run: %d differences resolved, the old release reported 1", tb.DifferencesResolved)
	}
}

type diffReport struct {
	RunID  string      `json:"run_id"`
	State  string      `json:"state"`
	Tables []diffTable `json:"tables"`
}

type diffTable struct {
	Table               string `json:"table"`
	RowsChecked         int64  `json:"rows_checked"`
	DifferencesTotal    int64  `json:"differences_total"`
	DifferencesResolved int64  `json:"differences_resolved"`
	Differences         []struct {
		Kind    string            `json:"kind"`
		Key     map[string]string `json:"key"`
		Columns []string          `json:"columns"`
	} `json:"differences"`
}

func (r *diffReport) table(name string) *diffTable {
	for i := range r.Tables {
		if r.Tables[i].Table == name {
			return &r.Tables[i]
		}
	}
	return nil
}

func readDiffReport(t *testing.T, dir string) diffReport {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep diffReport
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("%s/report.json: %v", dir, err)
	}
	return rep
}

// checkReport: the report is of run, done, and lists exactly the wanted differences of
// each table, with every upstream row checked.
func checkReport(t *testing.T, what string, rep diffReport, run string, want map[string][]string, rows map[string]int64) {
	t.Helper()
	if rep.RunID != run || rep.State != "done" {
		t.Errorf("%s: report of run %s in state %s, want run %s done", what, rep.RunID, rep.State, run)
	}
	if len(rep.Tables) != len(want) {
		t.Errorf("%s: %d tables reported, want %d", what, len(rep.Tables), len(want))
	}
	for name, w := range want {
		tb := rep.table(name)
		if tb == nil {
			t.Errorf("%s: table %s not reported", what, name)
			continue
		}
		var got []string
		for _, df := range tb.Differences {
			keys := make([]string, 0, len(df.Key))
			for k, v := range df.Key {
				keys = append(keys, k+"="+v)
			}
			sort.Strings(keys)
			s := df.Kind + " " + strings.Join(keys, ",")
			if len(df.Columns) > 0 {
				s += " [" + strings.Join(df.Columns, ",") + "]"
			}
			got = append(got, s)
		}
		sort.Strings(got)
		if !slices.Equal(got, w) || tb.DifferencesTotal != int64(len(w)) {
			t.Errorf("%s: table %s differences (total %d):\n  got  %q\n  want %q", what, name, tb.DifferencesTotal, got, w)
		}
		if tb.RowsChecked != rows[name] {
			t.Errorf("%s: table %s: %d rows checked, want %d (every upstream row)", what, name, tb.RowsChecked, rows[name])
		}
	}
}

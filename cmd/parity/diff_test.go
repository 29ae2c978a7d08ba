package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
)

// runCLI runs the parity command line with args and returns its exit code, stdout and
// stderr (which ends with the error of a failed command).
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	cmd := newRoot()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args)
	err := cmd.Execute()
	code := 0
	if err != nil {
		var ee *exitError
		if !errors.As(err, &ee) {
			t.Fatalf("%s: %v", args[0], err)
		}
		code = ee.code
		if ee.err != nil {
			errb.WriteString(ee.err.Error())
		}
	}
	return code, out.String(), errb.String()
}

// runDiffCLI runs `parity diff` with args; it returns the exit code and stdout followed
// by stderr.
func runDiffCLI(t *testing.T, args ...string) (int, string) {
	t.Helper()
	code, stdout, stderr := runCLI(t, append([]string{"diff"}, args...)...)
	return code, stdout + stderr
}

// execOn runs stmts on every db in turn.
func execOn(t *testing.T, dbs []*testenv.DB, stmts ...string) {
	t.Helper()
	for _, db := range dbs {
		for _, q := range stmts {
			if _, err := db.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func TestDiffCommand(t *testing.T) {
	up, down := testenv.MySQL(t), testenv.Downstream(t)
	execOn(t, []*testenv.DB{up, down}, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "diff.toml")
	toml := "tables = [\"" + up.Name + ".t\"]\n[[routes]]\nfrom = \"" + up.Name + "\"\nto = \"" + down.Name + "\"\n" +
		"[upstream]\ndsn = \"" + up.Root + "\"\n[downstream]\ndsn = \"" + down.Root + "\"\n"
	if err := os.WriteFile(cfgFile, []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	code, text := runDiffCLI(t, "--config", cfgFile, "--output", out)
	if code != 0 || !strings.Contains(text, "result: EQUAL") {
		t.Fatalf("equal: exit %d\n%s", code, text)
	}
	execOn(t, []*testenv.DB{down}, "UPDATE t SET v = 'X' WHERE id = 2")
	code, text = runDiffCLI(t, "--config", cfgFile, "--output", out)
	if code != 1 || !strings.Contains(text, "DIFFERENCES FOUND") {
		t.Fatalf("different: exit %d\n%s", code, text)
	}
	var rep struct {
		Tables []struct {
			Schema, Table    string
			RowsChecked      int64 `json:"rows_checked"`
			DifferencesTotal int64 `json:"differences_total"`
			Differences      []struct {
				Kind    string
				Key     map[string]string
				Columns []string
			}
			FixSQLFile string `json:"fix_sql_file"`
		}
	}
	data, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	tb := rep.Tables[0]
	if tb.Schema != up.Name || tb.Table != "t" || tb.RowsChecked != 3 || tb.DifferencesTotal != 1 ||
		tb.Differences[0].Kind != "differing" || tb.Differences[0].Key["id"] != "2" || tb.Differences[0].Columns[0] != "v" {
		t.Fatalf("report.json: %s", data)
	}
	fix, err := os.ReadFile(filepath.Join(out, tb.FixSQLFile))
	if err != nil || !strings.Contains(string(fix), "REPLACE INTO `"+down.Name+"`.`t` (`id`, `v`) VALUES (2, 'b');") {
		t.Fatalf("fix sql: %s %v", fix, err)
	}
	// Flags only, no config file; a bad DSN is an error (exit 2).
	code, text = runDiffCLI(t, "--upstream", "root@tcp(127.0.0.1:1)/", "--downstream", down.Root, "--table", "x.y")
	if code != 2 {
		t.Fatalf("unreachable upstream: exit %d\n%s", code, text)
	}
	code, text = runDiffCLI(t, "--upstream", up.Root)
	if code != 2 || !strings.Contains(text, "downstream.dsn") || !strings.Contains(text, "tables:") {
		t.Fatalf("missing flags: exit %d\n%s", code, text)
	}
}

// TestDiffLegacyConfigKeys: a config file of an earlier release, in snake_case, still
// runs; each old key is read as its kebab-case key with a warning naming the new one.
func TestDiffLegacyConfigKeys(t *testing.T) {
	up, down := testenv.MySQL(t), testenv.Downstream(t)
	execOn(t, []*testenv.DB{up, down}, "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10), u INT)", "INSERT INTO t VALUES (1, 'a', 1), (2, 'b', 2)")
	execOn(t, []*testenv.DB{down}, "UPDATE t SET u = 9 WHERE id = 2") // only in an ignored column
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "old.toml")
	old := "tables = [\"" + up.Name + ".t\"]\nignore_columns = [\"*.t.u\"]\nchunk_target_time = \"250ms\"\nrecheck_rounds = 0\n" +
		"[[routes]]\nfrom = \"" + up.Name + "\"\nto = \"" + down.Name + "\"\n" +
		"[upstream]\ndsn = \"" + up.Root + "\"\n[downstream]\ndsn = \"" + down.Root + "\"\n[changefeed]\nmeta_schema = \"parity_meta\"\n"
	if err := os.WriteFile(cfgFile, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	code, text := runDiffCLI(t, "--config", cfgFile, "--output", filepath.Join(dir, "out"))
	if code != 0 || !strings.Contains(text, "result: EQUAL") {
		t.Fatalf("legacy config: exit %d\n%s", code, text)
	}
	for _, w := range []string{
		"warning: config key ignore_columns is deprecated: use ignore-columns",
		"warning: config key chunk_target_time is deprecated: use chunk-target-time",
		"warning: config key recheck_rounds is deprecated: use recheck-rounds",
		"warning: config key changefeed.meta_schema is deprecated: use changefeed.meta-schema",
	} {
		if !strings.Contains(text, w) {
			t.Errorf("no %q in:\n%s", w, text)
		}
	}
	cfg, err := loadDiffConfig(newDiffCommand(), &diffFlags{config: cfgFile})
	if err != nil || cfg.ChunkTargetTime.String() != "250ms" || cfg.RecheckRounds != 0 || cfg.IgnoreColumns[0] != "*.t.u" {
		t.Fatalf("legacy keys not applied: %+v %v", cfg, err)
	}
	// An unknown key stays an error, legacy spelling or not.
	if err := os.WriteFile(cfgFile, []byte(old+"bogus_key = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, text := runDiffCLI(t, "--config", cfgFile); code != 2 || !strings.Contains(text, "bogus_key: unknown key") {
		t.Fatalf("unknown key: exit %d\n%s", code, text)
	}
}

func TestDiffExampleConfigParses(t *testing.T) {
	cmd := newDiffCommand()
	f := &diffFlags{config: filepath.Join("..", "..", "deploy", "diff.example.toml")}
	cfg, err := loadDiffConfig(cmd, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Routes) != 2 || cfg.ChunkTargetTime.String() != "500ms" || cfg.TableConfigs[0].Where == "" ||
		cfg.TiDBChecksum != checker.TiDBChecksumAuto {
		t.Fatalf("parsed: %+v", cfg)
	}
}

// TestDiffWaitsForChangefeedLag: with --changefeed and --max-lag, `parity diff` compares
// nothing while the changefeed's applied checkpoint (in parity serve's meta schema on the
// downstream) is older than the limit, and finishes once it catches up; a changefeed
// without a checkpoint is an error naming it.
func TestDiffWaitsForChangefeedLag(t *testing.T) {
	up, down := testenv.MySQL(t), testenv.Downstream(t)
	execOn(t, []*testenv.DB{up, down}, "CREATE TABLE lg (id INT PRIMARY KEY)", "INSERT INTO lg VALUES (1), (2)")
	ms := testenv.UniqueName("pm")
	mq := ident.Quote(ms)
	t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + mq) })
	tso := func(at time.Time) uint64 { return uint64(at.UnixMilli()) << 18 }
	execOn(t, []*testenv.DB{down},
		"CREATE DATABASE "+mq,
		// parity serve's checkpoint table (cdc/meta.go), as parity diff reads it.
		"CREATE TABLE "+mq+".checkpoint (changefeed VARCHAR(128) NOT NULL PRIMARY KEY, applied_ts BIGINT UNSIGNED NOT NULL)",
		fmt.Sprintf("INSERT INTO %s.checkpoint VALUES ('cf', %d)", mq, tso(time.Now().Add(-time.Hour))))
	args := []string{"--upstream", up.Root, "--downstream", down.Root, "--table", up.Name + ".lg",
		"--changefeed-meta-schema", ms, "--max-lag", "30s"}
	route := filepath.Join(t.TempDir(), "route.toml")
	if err := os.WriteFile(route, []byte("[[routes]]\nfrom = \""+up.Name+"\"\nto = \""+down.Name+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args = append(args, "--config", route)

	code, out := runDiffCLI(t, append(args, "--changefeed", "nope")...)
	if code != 2 || !strings.Contains(out, `changefeed "nope" has no checkpoint`) {
		t.Fatalf("unknown changefeed: exit %d, output:\n%s", code, out)
	}

	done := make(chan string, 1)
	start := time.Now()
	go func() {
		code, out := runDiffCLI(t, append(args, "--changefeed", "cf")...)
		done <- fmt.Sprintf("exit %d: %s", code, out)
	}()
	select {
	case res := <-done:
		t.Fatalf("the diff ran while the changefeed lagged an hour: %s", res)
	case <-time.After(2500 * time.Millisecond):
	}
	execOn(t, []*testenv.DB{down}, fmt.Sprintf("UPDATE %s.checkpoint SET applied_ts = %d WHERE changefeed = 'cf'", mq, tso(time.Now())))
	select {
	case res := <-done:
		if !strings.HasPrefix(res, "exit 0:") {
			t.Fatalf("after the changefeed caught up: %s", res)
		}
		t.Logf("finished %s after start (the changefeed caught up at 2.5 s)", time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("the diff did not finish after the changefeed caught up")
	}
}

// TestDiffRecheckWaitsForChangefeed: with --changefeed, the re-check of a live diff's
// differences waits until the changefeed's applied checkpoint (parity serve's meta schema
// on the downstream) has passed the comparison; a row that replication applied in the
// meantime is then equal, and the run ends equal, saying so.
func TestDiffRecheckWaitsForChangefeed(t *testing.T) {
	up, down := testenv.MySQL(t), testenv.Downstream(t)
	execOn(t, []*testenv.DB{up, down}, "CREATE TABLE rw (id INT PRIMARY KEY, v VARCHAR(10))", "INSERT INTO rw VALUES (1, 'a'), (2, 'b')")
	inFlight := "UPDATE rw SET v = 'new' WHERE id = 2"
	execOn(t, []*testenv.DB{up}, inFlight)
	ms := testenv.UniqueName("pm")
	mq := ident.Quote(ms)
	t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + mq) })
	tso := func(at time.Time) uint64 { return uint64(at.UnixMilli()) << 18 }
	execOn(t, []*testenv.DB{down}, "CREATE DATABASE "+mq,
		"CREATE TABLE "+mq+".checkpoint (changefeed VARCHAR(128) NOT NULL PRIMARY KEY, applied_ts BIGINT UNSIGNED NOT NULL)",
		fmt.Sprintf("INSERT INTO %s.checkpoint VALUES ('cf', %d)", mq, tso(time.Now().Add(-time.Hour))))
	route := filepath.Join(t.TempDir(), "route.toml")
	if err := os.WriteFile(route, []byte("[[routes]]\nfrom = \""+up.Name+"\"\nto = \""+down.Name+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan string, 1)
	go func() {
		code, out := runDiffCLI(t, "--upstream", up.Root, "--downstream", down.Root, "--table", up.Name+".rw", "--config", route,
			"--changefeed-meta-schema", ms, "--changefeed", "cf")
		done <- fmt.Sprintf("exit %d: %s", code, out)
	}()
	// Wait for the comparison to store the difference: the run is then in its re-check.
	deadline := time.Now().Add(60 * time.Second)
	for {
		var n int
		err := down.QueryRow(`SELECT COUNT(*) FROM `+metaTable("diff_differences")+` d JOIN `+metaTable("diff_tables")+` t USING (run_id, table_idx)
			WHERE t.down_schema = ? AND t.down_table = 'rw'`, down.Name).Scan(&n)
		if err == nil && n > 0 {
			break
		}
		select {
		case res := <-done:
			t.Fatalf("the diff ended before its re-check: %s", res)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the comparison stored no difference")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case res := <-done:
		t.Fatalf("the re-check did not wait for the changefeed, an hour behind: %s", res)
	case <-time.After(time.Second):
	}
	// Replication applies the row, and the checkpoint moves past the comparison.
	execOn(t, []*testenv.DB{down}, inFlight, fmt.Sprintf("UPDATE %s.checkpoint SET applied_ts = %d WHERE changefeed = 'cf'", mq, tso(time.Now())))
	select {
	case res := <-done:
		if !strings.HasPrefix(res, "exit 0:") || !strings.Contains(res, "1 rows that differed when first read were equal when read again") ||
			!strings.Contains(res, "result: EQUAL") || !strings.Contains(res, "re-checking 1 differences (waiting for the changefeed, 1h0m") {
			t.Fatalf("after the changefeed caught up: %s", res)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the diff did not finish after the changefeed caught up")
	}
}

func TestPrintSummarySnapshots(t *testing.T) {
	at := time.Date(2026, 11, 21, 13, 42, 5, 250e6, time.UTC)
	rep := &checker.Report{RunID: "r1", Equal: true, UpstreamSnapshot: fmt.Sprint(uint64(at.UnixMilli()) << 18), DownstreamSnapshot: "2026-11-21 13:00:00"}
	var b bytes.Buffer
	printSummary(&b, rep, "")
	for _, want := range []string{"upstream read at snapshot " + rep.UpstreamSnapshot + " (2026-11-21 13:42:05.250 UTC)",
		"downstream read at snapshot 2026-11-21 13:00:00\n", "result: EQUAL"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	printSummary(&b, &checker.Report{RunID: "r2", Equal: true}, "")
	if strings.Contains(b.String(), "snapshot") {
		t.Errorf("summary without snapshots mentions one:\n%s", b.String())
	}
}

// metaTable names a table of the default meta schema as the migrator registered it.
func metaTable(name string) string { return metaschema.Table(checker.DefaultConfig().MetaSchema, name) }

// TestDiffScopeFlags: --scope and --caught-up-lag reach the checker's config, are validated
// with their keys, and a scope the changefeed's ledger cannot serve is refused with a clear
// error (exit 2, and no advice to resume a run that compared nothing).
func TestDiffScopeFlags(t *testing.T) {
	up, down := testenv.MySQL(t), testenv.Downstream(t)
	base := []string{"--upstream", up.Root, "--downstream", down.Root, "--table", up.Name + ".t"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--scope", "cdc"}, "changefeed.id: is required with scope cdc"},
		{[]string{"--scope", "since:1700000000", "--changefeed", "cf"}, "is not a TiDB TSO"},
		{[]string{"--scope", "everything"}, `scope: unknown scope "everything"`},
		{[]string{"--caught-up-lag", "-1s"}, "caught-up-lag: must not be negative"},
	} {
		code, out := runDiffCLI(t, append(base, c.args...)...)
		if code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("%v: exit %d, output:\n%s\nwant %q", c.args, code, out, c.want)
		}
	}
	execOn(t, []*testenv.DB{up, down}, "CREATE TABLE t (id INT PRIMARY KEY)")
	ms := testenv.UniqueName("pm")
	t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(ms)) })
	route := filepath.Join(t.TempDir(), "route.toml")
	if err := os.WriteFile(route, []byte("meta-schema = \""+ms+"\"\n[[routes]]\nfrom = \""+up.Name+"\"\nto = \""+down.Name+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The meta schema has no ledger (no parity serve wrote one): refused, naming it.
	code, out := runDiffCLI(t, append(base, "--config", route, "--scope", "since:2026-01-02T15:04:05Z", "--changefeed", "cf", "--changefeed-meta-schema", ms)...)
	if code != 2 || !strings.Contains(out, "scope unavailable: scope since:") || !strings.Contains(out, "no dirty-key ledger of changefeed cf") || strings.Contains(out, "resume with") {
		t.Errorf("a scope without a ledger: exit %d, output:\n%s", code, out)
	}
}

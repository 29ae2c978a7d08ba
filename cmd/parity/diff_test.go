package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

func TestDiffCommand(t *testing.T) {
	up, down := testenv.MySQL(t), testenv.Downstream(t)
	for _, db := range []*testenv.DB{up, down} {
		if _, err := db.Exec("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(10))"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec("INSERT INTO t VALUES (1, 'a'), (2, 'b'), (3, 'c')"); err != nil {
			t.Fatal(err)
		}
	}
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
	if _, err := down.Exec("UPDATE t SET v = 'X' WHERE id = 2"); err != nil {
		t.Fatal(err)
	}
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

func TestDiffExampleConfigParses(t *testing.T) {
	cmd := newDiffCommand()
	f := &diffFlags{config: filepath.Join("..", "..", "deploy", "diff.example.toml")}
	cfg, err := loadDiffConfig(cmd, f)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Routes) != 2 || cfg.ChunkTargetTime.String() != "500ms" || cfg.TableConfigs[0].Where == "" {
		t.Fatalf("parsed: %+v", cfg)
	}
}

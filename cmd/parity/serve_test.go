package main

import (
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/tidb-parity/parity/daemon"
)

// The example config documents every key with its default: it must decode strictly and,
// apart from the required placeholders, equal the defaults.
func TestExampleConfigIsValidAndDefault(t *testing.T) {
	cfg, err := loadServeConfig(filepath.Join("..", "..", "deploy", "parity.example.toml"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("example config invalid: %v", err)
	}
	want := daemon.DefaultConfig()
	want.Changefeed.Brokers = []string{"127.0.0.1:9092"}
	want.Changefeed.Topics = []string{"ticdc-open"}
	want.Downstream.DSN = "parity:secret@tcp(127.0.0.1:3306)/"
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("example config differs from the defaults:\n got %+v\nwant %+v", cfg, want)
	}
	if cfg.Applier.RetryBackoff != 100*time.Millisecond {
		t.Fatalf("retry-backoff decoded as %v", cfg.Applier.RetryBackoff)
	}
}

func TestConfigRejectsUnknownKeysAndReportsEveryProblem(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(p, []byte("[changefeed]\nbrokers=[\"k:9092\"]\ntopix=[\"x\"]\n[applier]\nworkers=1\nbogus=2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := loadServeConfig(p, io.Discard)
	if err == nil {
		t.Fatal("unknown keys accepted")
	}
	for _, k := range []string{"changefeed.topix: unknown key", "applier.bogus: unknown key"} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("error %q does not name %q", err, k)
		}
	}

	cfg := daemon.DefaultConfig()
	cfg.Changefeed.Compression = "zstd"
	cfg.Changefeed.TimeZone = "Mars/Olympus"
	cfg.Applier.Workers = 0
	cfg.Applier.MetaSchema = "bad name"
	cfg.Log.Format = "xml"
	cfg.Upstream.DSN = "no slash"
	err = cfg.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, k := range []string{"changefeed.brokers: required", "changefeed.topics:", "changefeed.compression:",
		"changefeed.time-zone:", "upstream.dsn:", "downstream.dsn: required", "applier.workers:", "applier.meta-schema:", "log.format:"} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("error does not report %q:\n%v", k, err)
		}
	}
}

// Settings are layered: defaults < file < environment < flags.
func TestServeConfigLayers(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "parity.toml")
	if err := os.WriteFile(p, []byte(`[changefeed]
brokers = ["file:9092"]
topics = ["from-file"]
[downstream]
dsn = "file@tcp(file:3306)/"
[applier]
workers = 2
batch-rows = 10
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(envDownstreamDSN, "env@tcp(env:3306)/")
	t.Setenv(envUpstreamDSN, "up@tcp(env:4000)/")
	run := func(args ...string) daemon.Config {
		t.Helper()
		var got daemon.Config
		cmd, f := newServeCommand()
		cmd.RunE = func(c *cobra.Command, _ []string) error {
			var err error
			got, _, err = resolveServeConfig(c, f)
			return err
		}
		cmd.SetArgs(append([]string{"--config", p}, args...))
		if err := cmd.Execute(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	cfg := run("--workers", "5", "--brokers", "a:1,b:2")
	if cfg.Applier.Workers != 5 || cfg.Applier.BatchRows != 10 || cfg.Downstream.DSN != "env@tcp(env:3306)/" ||
		cfg.Upstream.DSN != "up@tcp(env:4000)/" || !reflect.DeepEqual(cfg.Changefeed.Brokers, []string{"a:1", "b:2"}) ||
		!reflect.DeepEqual(cfg.Changefeed.Topics, []string{"from-file"}) || cfg.Applier.MetaSchema != "parity_meta" {
		t.Fatalf("layered config: %+v", cfg)
	}
	if cfg.Status.Pprof {
		t.Fatalf("status.pprof on by default")
	}
	if cfg = run("--pprof"); !cfg.Status.Pprof {
		t.Fatalf("--pprof did not set status.pprof")
	}
	cfg = run("--downstream-dsn", "flag@tcp(flag:3306)/")
	if cfg.Downstream.DSN != "flag@tcp(flag:3306)/" || cfg.Applier.Workers != 2 {
		t.Fatalf("flag over env: %+v", cfg)
	}
}

// --check-config prints the effective configuration, passwords redacted, as TOML that
// decodes strictly again.
func TestServeCheckConfig(t *testing.T) {
	t.Setenv(envDownstreamDSN, "app:s3cret@tcp(db:3306)/")
	cmd, _ := newServeCommand()
	var out strings.Builder
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--check-config", "--brokers", "k:9092", "--topics", "t1"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "s3cret") || !strings.Contains(out.String(), "REDACTED") {
		t.Fatalf("password not redacted:\n%s", out.String())
	}
	p := filepath.Join(t.TempDir(), "printed.toml")
	if err := os.WriteFile(p, []byte(out.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadServeConfig(p, io.Discard)
	if err != nil {
		t.Fatalf("printed config does not decode: %v\n%s", err, out.String())
	}
	if cfg.Applier.RetryBackoff != 100*time.Millisecond || cfg.Changefeed.Topics[0] != "t1" {
		t.Fatalf("printed config: %+v", cfg)
	}
}

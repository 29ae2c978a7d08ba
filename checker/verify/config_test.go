package verify

import (
	"fmt"
	"os"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/internal/instance"
	"github.com/tidb-parity/parity/internal/tso"
)

func validConfig() Config {
	c := DefaultConfig()
	c.Enabled = true
	c.Tables = []string{"app.*"}
	c.Changefeed, c.UpstreamDSN, c.DownstreamDSN, c.MetaSchema = "cf", "root@tcp(127.0.0.1:4000)/", "root@tcp(127.0.0.1:3306)/", "parity_meta"
	return c
}

func TestConfigValidate(t *testing.T) {
	if err := validConfig().Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default (disabled) config: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		want []string
	}{
		{"scope since garbage", func(c *Config) { c.Scope = "since:yesterday" }, []string{`verify.scope:`}},
		{"caught-up lag", func(c *Config) { c.CaughtUpLag = -time.Second }, []string{"verify.caught-up-lag: must not be negative"}},
		{"scope unknown", func(c *Config) { c.Scope = "all" }, []string{`verify.scope: unknown scope "all"`}},
		{"no tables", func(c *Config) { c.Tables = nil }, []string{"verify.tables: at least one"}},
		{"bad table", func(c *Config) { c.Tables = []string{"app"} }, []string{"verify.tables[0]: want schema.table"}},
		{"bad exclude", func(c *Config) { c.Exclude = []string{"a.[b"} }, []string{"verify.exclude[0]: bad pattern"}},
		{"view age", func(c *Config) { c.MaxViewAge = 10 * time.Millisecond }, []string{"verify.max-view-age: must be at least 1s"}},
		{"negatives", func(c *Config) {
			c.ContinuousInterval, c.MaxLag, c.MaxRowsPerSecond, c.MaxThreadsRunning = -1, -1, -1, -1
		}, []string{"verify.continuous-interval", "verify.max-lag", "verify.max-rows-per-second", "verify.max-threads-running"}},
		{"bounds", func(c *Config) { c.MaxConcurrentRuns, c.MaxConnections, c.QueryTimeout = 0, 65, 0 },
			[]string{"verify.max-concurrent-runs", "verify.max-connections", "verify.query-timeout"}},
		{"schedules", func(c *Config) {
			c.Schedules = []Schedule{
				{Name: "nightly", Cron: "0 2 * * *"},
				{Name: "nightly", Cron: "every day"},
				{Name: "manual", Cron: "@hourly", Scope: "cdc-ish"},
				{Cron: "", Tables: []string{"x"}},
			}
		}, []string{
			`verify.schedule[1].name: "nightly" is also the name of verify.schedule[0]`,
			"verify.schedule[1].cron:",
			`verify.schedule[2].name: "manual" names another trigger`,
			`verify.schedule[2].scope: unknown scope "cdc-ish"`,
			"verify.schedule[3].name: required",
			"verify.schedule[3].cron: required",
			"verify.schedule[3].tables[0]: want schema.table",
		}},
		{"history retention", func(c *Config) { c.HistoryRetention = 30 * time.Minute },
			[]string{"verify.history-retention: must be 0 (keep every run) or at least 1h, got 30m0s"}},
		{"instance too long", func(c *Config) { c.Instance = strings.Repeat("x", 129) }, []string{"verify.instance: longer than 128 bytes"}},
		{"instance spaces", func(c *Config) { c.Instance = " a " }, []string{`verify.instance: " a " has leading or trailing space`}},
		{"wiring", func(c *Config) { c.Changefeed, c.UpstreamDSN, c.DownstreamDSN, c.MetaSchema = "", "", "x", "" },
			[]string{"changefeed.id: required", "upstream.dsn: required with verify.enabled", "downstream.dsn:", "applier.meta-schema: required"}},
	} {
		c := validConfig()
		tc.edit(&c)
		err := c.Validate()
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", tc.name, err, w)
			}
		}
	}
	for _, ok := range []string{"full", "cdc", "since:2026-01-01T00:00:00Z", "since:463267587686400000"} {
		if err := CheckScope(ok); err != nil {
			t.Errorf("CheckScope(%s) = %v", ok, err)
		}
	}
	// Accepted cron forms.
	for _, spec := range []string{"0 2 * * *", "*/10 * * * * *", "@daily", "@every 2s", "CRON_TZ=Europe/Paris 30 1 * * 1-5"} {
		c := validConfig()
		c.Schedules = []Schedule{{Name: "s", Cron: spec}}
		if err := c.Validate(); err != nil {
			t.Errorf("cron %q: %v", spec, err)
		}
	}
}

func TestFreshness(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) uint64 { return tso.FromTime(now.Add(-d)) }
	for _, tc := range []struct {
		applied, covered uint64
		want             time.Duration
		ok               bool
	}{
		{at(time.Second), 0, 0, false},                                  // never verified
		{at(time.Minute), at(time.Minute), 0, true},                     // nothing applied beyond the clean run's pair
		{at(2 * time.Minute), at(time.Minute), 0, true},                 // the applier is behind the pair (restarted)
		{at(time.Second), at(90 * time.Second), 90 * time.Second, true}, // changes after the pair may be uncovered
	} {
		got, ok := Freshness(now, tc.applied, tc.covered)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Freshness(applied %d, covered %d) = %v, %v; want %v, %v", tc.applied, tc.covered, got, ok, tc.want, tc.ok)
		}
	}
}

// exactPattern selects its table and no other, whatever characters the names hold.
func TestExactPattern(t *testing.T) {
	for _, n := range [][2]string{{"app", "orders"}, {"a*b", "t?"}, {"s[1]", `x\y`}, {"ü", "ñ*"}} {
		p, err := checker.ExactTablePattern(n[0], n[1])
		if err != nil {
			t.Fatal(err)
		}
		if err := checker.CheckTablePattern(p); err != nil {
			t.Fatalf("%q: %v", p, err)
		}
		if !checker.MatchTable(p, n[0], n[1]) {
			t.Errorf("%q does not match %s.%s", p, n[0], n[1])
		}
		for _, other := range [][2]string{{"axb", "t1"}, {"s1", "xy"}, {"app", "orders2"}, {n[0], n[1] + "x"}} {
			if other != n && checker.MatchTable(p, other[0], other[1]) {
				t.Errorf("%q matches %s.%s", p, other[0], other[1])
			}
		}
	}
	if _, err := checker.ExactTablePattern("a.b", "c"); err == nil {
		t.Error("a dotted name was accepted")
	}
	if ok, _ := path.Match(`\*`, "*"); !ok {
		t.Fatal("path.Match escapes differ")
	}
}

// An empty verify.instance is "<hostname>:<pid>", what New gives the service.
func TestDefaultInstance(t *testing.T) {
	host, _ := os.Hostname()
	want := fmt.Sprintf("%s:%d", host, os.Getpid())
	if got := instance.DefaultInstance(); got != want {
		t.Fatalf("instance.DefaultInstance() = %q, want %q", got, want)
	}
	c := validConfig()
	c.Instance = ""
	s, err := New(c, Deps{Applier: &stillApplier{}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Stats().Instance != want {
		t.Fatalf("Stats().Instance = %q, want %q", s.Stats().Instance, want)
	}
}

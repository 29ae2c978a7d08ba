package main

// observability_test.go proves the committed dashboards and alert rules true: promtool
// checks and unit-tests the rules, and a real Prometheus scrapes a live parity serve
// (loadgen through Kafka, verification runs) and evaluates every panel query and alert
// expression. Prometheus and promtool come from scripts/build-prometheus.sh (scripts/env
// up puts their directory in var/env.sh as PARITY_PROMETHEUS_DIR).

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/checker/verify"
	"github.com/tidb-parity/parity/dashboards"
	"github.com/tidb-parity/parity/internal/testenv"
)

const (
	alertRules = "../../deploy/prometheus/parity-alerts.yml"
	alertTests = "../../deploy/prometheus/parity-alerts_test.yml"
	runbook    = "../../deploy/runbook.md"
)

// prometheusDir is the directory holding the prometheus and promtool binaries; skipped
// (locally) or failed (CI=true) without it, like the servers of internal/testenv.
func prometheusDir(t *testing.T) string {
	t.Helper()
	dir := testenv.Require(t, "PARITY_PROMETHEUS_DIR")
	for _, b := range []string{"prometheus", "promtool"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Fatalf("PARITY_PROMETHEUS_DIR=%s: %v (scripts/build-prometheus.sh builds it)", dir, err)
		}
	}
	return dir
}

type ruleFile struct {
	Groups []struct {
		Name  string
		Rules []struct {
			Alert       string
			Expr        string
			For         string
			Labels      map[string]string
			Annotations map[string]string
		}
	}
}

func readRules(t *testing.T) ruleFile {
	t.Helper()
	raw, err := os.ReadFile(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	dec := yaml.NewDecoder(strings.NewReader(string(raw)))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("%s: %v", alertRules, err)
	}
	return rf
}

// TestAlertRules: promtool accepts the rules and their unit tests pass; every alert has
// a summary, a description and a runbook_url whose anchor is a section of the runbook's
// "## Alerts"; the unit tests make every alert fire and not fire.
func TestAlertRules(t *testing.T) {
	dir := prometheusDir(t)
	for _, args := range [][]string{{"check", "rules", alertRules}, {"test", "rules", alertTests}} {
		out, err := exec.Command(filepath.Join(dir, "promtool"), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	rb, err := os.ReadFile(runbook)
	if err != nil {
		t.Fatal(err)
	}
	_, alertsPart, ok := strings.Cut(string(rb), "\n## Alerts\n")
	if !ok {
		t.Fatal("deploy/runbook.md has no ## Alerts section")
	}
	if i := strings.Index(alertsPart, "\n## "); i >= 0 {
		alertsPart = alertsPart[:i]
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^### (\S+)$`).FindAllStringSubmatch(alertsPart, -1) {
		anchors[strings.ToLower(m[1])] = true
	}

	var tests struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string
				ExpAlerts []any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		}
	}
	raw, err := os.ReadFile(alertTests)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &tests); err != nil {
		t.Fatal(err)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	want := []string{"ParityDown", "ParityApplierStopped", "ParityCheckpointLagHigh", "ParityDeadLetters", "ParityVerificationStale",
		"ParityDifferencesFound", "ParityScheduledVerificationFailed", "ParityScheduledVerificationMissed", "ParitySnapshotReadViewTooOld", "ParitySnapshotReadNotRepeatable",
		"ParityBypassDetectorBehind", "ParityFleetMemberBehind"}
	var got []string
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			got = append(got, r.Alert)
			for _, k := range []string{"summary", "description", "runbook_url"} {
				if r.Annotations[k] == "" {
					t.Errorf("alert %s has no %s", r.Alert, k)
				}
			}
			if r.Labels["severity"] == "" {
				t.Errorf("alert %s has no severity", r.Alert)
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], "deploy/runbook.md#")
			if !ok || !anchors[anchor] {
				t.Errorf("alert %s: runbook_url %q is not a section of deploy/runbook.md's ## Alerts", r.Alert, r.Annotations["runbook_url"])
			}
			if !fires[r.Alert] || !silent[r.Alert] {
				t.Errorf("alert %s: the promtool tests must make it fire (%v) and not fire (%v)", r.Alert, fires[r.Alert], silent[r.Alert])
			}
		}
	}
	for _, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("no alert %s", w)
		}
	}
}

// TestDashboardsAndAlertsAreTrue: a real Prometheus scrapes a live parity serve that
// applies a loadgen changefeed through Kafka and verifies it on a schedule (named
// cutover-check, feeding the Cutover dashboard's panels); then every panel query of
// every committed dashboard and every alert expression parses, names only metrics the
// scrape has, and every panel query returns data.
func TestDashboardsAndAlertsAreTrue(t *testing.T) {
	promDir := prometheusDir(t)
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, "obs", 2)
	db := testenv.UniqueName("obs")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	load := startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 2, 2, 500
		lg.Rate, lg.RowsPerTxn = 200, 5
	})
	const changefeed = "obs-truth"
	cfg := verifyServeConfig(t, changefeed, upDSN, down, broker, topic, db, load.ImportTs)
	cfg.Verify.Schedules = []verify.Schedule{{Name: "cutover-check", Cron: "@every 4s"}}
	cfg.Verify.ContinuousInterval = 3 * time.Second
	// Bypass detection on: its panel and ParityBypassDetectorBehind read its metrics.
	var sid [4]byte
	_, _ = rand.Read(sid[:])
	cfg.Bypass.Enabled, cfg.Bypass.ServerID, cfg.Bypass.Schemas = true, 100000+binary.LittleEndian.Uint32(sid[:])%1000000000, []string{db}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv := runServeInTest(t, ctx, cfg)
	defer srv.Close()

	prom := startPrometheus(t, ctx, promDir, cfg.Status.Addr)

	// Wait for a clean scheduled run and a few scrapes after it.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, _, err := fetchStatus(ctx, cfg.Status.Addr)
		if err == nil && st.Verify != nil && st.Verify.Verified && hasRun(st.Verify.Runs, "cutover-check", verify.ResultEqual) &&
			hasRun(st.Verify.Runs, verify.TriggerContinuous, verify.ResultEqual) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no clean cutover-check and continuous runs within 2 minutes: %+v %v", st.Verify, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	time.Sleep(6 * time.Second) // 1s scrapes: rates over 10s have their samples

	scrape := metrics(t, cfg.Status.Addr)
	lintMetrics(t, scrape)
	names := map[string]bool{}
	for _, line := range strings.Split(scrape, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}

	// The daemon is scraped as fleet member obsMember (the Fleet dashboard's $member).
	subst := strings.NewReplacer("$changefeed", changefeed, "$member", obsMember, "$__rate_interval", "10s", "$__range", "2m")
	queries, err := dashboards.Queries("../../dashboards")
	if err != nil {
		t.Fatal(err)
	}
	if len(queries) < 40 {
		t.Fatalf("%d dashboard queries", len(queries))
	}
	for _, q := range queries {
		where := q.File + ": " + q.Panel
		expr := subst.Replace(q.Expr)
		checkNames(t, where, expr, names)
		if n := prom.query(t, where, expr); n == 0 {
			t.Errorf("%s: %s returns no data", where, expr)
		}
	}
	rules := 0
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			rules++
			checkNames(t, "alert "+r.Alert, r.Expr, names)
			prom.query(t, "alert "+r.Alert, r.Expr) // parses and evaluates; firing or not
		}
	}
	// Prometheus loaded the same rule file and evaluates it without errors.
	var rs struct {
		Groups []struct {
			Rules []struct {
				Name, Health, LastError string
			}
		}
	}
	prom.get(t, "/api/v1/rules", nil, &rs)
	loaded := 0
	for _, g := range rs.Groups {
		for _, r := range g.Rules {
			loaded++
			if r.Health != "ok" || r.LastError != "" {
				t.Errorf("rule %s: health %s %s", r.Name, r.Health, r.LastError)
			}
		}
	}
	if loaded != rules {
		t.Errorf("Prometheus loaded %d rules, the file has %d", loaded, rules)
	}
	t.Logf("%d panel queries and %d alert expressions evaluated against %d scraped metric names", len(queries), rules, len(names))
}

func hasRun(runs []verify.RunCount, trigger, result string) bool {
	for _, r := range runs {
		if r.Trigger == trigger && r.Result == result && r.Runs > 0 {
			return true
		}
	}
	return false
}

var (
	metricName = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	// Strings, label matchers and durations, which hold no metric names.
	notNames = regexp.MustCompile(`"[^"]*"|\{[^}]*\}|\[[^\]]*\]|\b(by|without|on|ignoring|group_left|group_right|bool|and|or|unless|offset)\s*(\([^)]*\))?`)
)

// checkNames fails unless every metric expr names is in the scrape (names), or is up
// (Prometheus' own series per target). Function names are the words followed by "(".
func checkNames(t *testing.T, where, expr string, names map[string]bool) {
	t.Helper()
	stripped := notNames.ReplaceAllString(expr, " ")
	for _, loc := range metricName.FindAllStringIndex(stripped, -1) {
		word := stripped[loc[0]:loc[1]]
		rest := strings.TrimLeft(stripped[loc[1]:], " ")
		if strings.HasPrefix(rest, "(") || word == "time" || (word[0] >= '0' && word[0] <= '9') {
			continue
		}
		if word == "up" {
			continue
		}
		if !names[word] {
			t.Errorf("%s: %s names %s, which the scrape does not have", where, expr, word)
		}
	}
}

// obsMember is the member label startPrometheus gives its target, as a fleet's scrape
// configuration gives each member's daemons theirs (deploy/prometheus/prometheus-fleet.yml).
const obsMember = "obs-member"

type promServer struct {
	base string
}

// startPrometheus runs Prometheus scraping target every second as job "parity" with
// the label member=obsMember, with the alert rules loaded, until the test ends.
func startPrometheus(t *testing.T, ctx context.Context, dir, target string) *promServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rules, err := filepath.Abs(alertRules)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	conf := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: parity
    static_configs:
      - targets: [%q]
        labels: {member: %q}
`, rules, target, obsMember)
	if err := os.WriteFile(filepath.Join(tmp, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(tmp, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	pctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	cmd := exec.CommandContext(pctx, filepath.Join(dir, "prometheus"), "--config.file="+filepath.Join(tmp, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(tmp, "data"), "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("prometheus log:\n%s", b)
			}
		}
	})
	p := &promServer{base: "http://" + addr}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(p.base + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready within 60s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// get calls the HTTP API and decodes its data into out; it fails on an error answer.
func (p *promServer) get(t *testing.T, path string, params url.Values, out any) {
	t.Helper()
	resp, err := http.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var env struct {
		Status, Error, ErrorType string
		Data                     json.RawMessage
	}
	if err := json.Unmarshal(raw, &env); err != nil || env.Status != "success" {
		t.Errorf("prometheus %s %v: %s %s: %s", path, params, env.ErrorType, env.Error, raw)
		return
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		t.Fatal(err)
	}
}

// query evaluates expr now and returns how many series it returned (failing the test
// when it does not parse or evaluate).
func (p *promServer) query(t *testing.T, where, expr string) int {
	t.Helper()
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	data.Result = json.RawMessage("[]")
	p.get(t, "/api/v1/query", url.Values{"query": {expr}}, &data)
	var series []any
	if err := json.Unmarshal(data.Result, &series); err != nil {
		t.Errorf("%s: %s: result %s", where, expr, data.Result)
		return 0
	}
	return len(series)
}

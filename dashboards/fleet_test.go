package dashboards

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestFleetDashboard: the fleet dashboard has a member variable over the label
// Prometheus attaches to each member's daemons; every query selects $member (and
// $changefeed), and the per-member panels draw one line per member: they aggregate by
// member and their legend names it.
func TestFleetDashboard(t *testing.T) {
	raw, err := os.ReadFile("fleet.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(d.Templating.List, func(v struct {
		Name       string `json:"name"`
		Definition string `json:"definition"`
	}) bool {
		return v.Name == "member"
	})
	if i < 0 || !strings.Contains(d.Templating.List[i].Definition, ", member)") {
		t.Fatalf("fleet.json: no member variable over the member label: %+v", d.Templating.List)
	}
	perMember := 0
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			if !strings.Contains(q.Expr, `member=~"$member"`) {
				t.Errorf("%s: %s does not select $member", p.Title, q.Expr)
			}
			if q.LegendFormat == "{{member}}" {
				perMember++
				if !strings.HasPrefix(q.Expr, "max by (member) (") && !strings.HasPrefix(q.Expr, "sum by (member) (") {
					t.Errorf("%s: %s draws one line per member but does not aggregate by member", p.Title, q.Expr)
				}
			}
		}
	}
	// Lag, resolved lag, freshness, last result (a line and a tile), Kafka lag, rows, differences.
	if perMember < 8 {
		t.Errorf("fleet.json: %d per-member queries", perMember)
	}
	for _, title := range []string{"Applied checkpoint lag per member", "Verification freshness per member", "Last verification result per member"} {
		if !slices.ContainsFunc(d.Panels, func(p struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
			} `json:"targets"`
		}) bool {
			return p.Title == title && p.Type == "timeseries"
		}) {
			t.Errorf("fleet.json: no timeseries %q", title)
		}
	}
}

// TestQueriesParse: promtool parses every panel query of every committed dashboard
// (written as recording rules, the dashboard variables replaced as Grafana does) when
// PARITY_PROMETHEUS_DIR (scripts/env up) holds it. That the queries name only metrics
// parity serve exports, and return data, is TestDashboardsAndAlertsAreTrue's
// (cmd/parity), against a live daemon scraped with a member label.
func TestQueriesParse(t *testing.T) {
	dir := os.Getenv("PARITY_PROMETHEUS_DIR")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("PARITY_PROMETHEUS_DIR is not set (scripts/env up sets it in var/env.sh)")
		}
		t.Skip("PARITY_PROMETHEUS_DIR is not set: source var/env.sh (scripts/env up)")
	}
	qs, err := Queries(".")
	if err != nil {
		t.Fatal(err)
	}
	subst := strings.NewReplacer("$changefeed", "cf", "$member", ".*", "$__rate_interval", "1m", "$__range", "1h")
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboards\n    rules:\n")
	for i, q := range qs {
		expr, err := json.Marshal(subst.Replace(q.Expr)) // a JSON string is a YAML string
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "      - record: dashboard_query_%d\n        expr: %s\n", i, expr)
	}
	rules := filepath.Join(t.TempDir(), "queries.yml")
	if err := os.WriteFile(rules, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(filepath.Join(dir, "promtool"), "check", "rules", rules).CombinedOutput()
	if err != nil {
		// Name the panels of the queries promtool rejected.
		for _, m := range regexp.MustCompile(`dashboard_query_(\d+)`).FindAllStringSubmatch(string(out), -1) {
			var i int
			fmt.Sscan(m[1], &i)
			t.Errorf("%s: %s: %s", qs[i].File, qs[i].Panel, qs[i].Expr)
		}
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), fmt.Sprintf("%d rules found", len(qs))) {
		t.Fatalf("promtool did not check %d queries:\n%s", len(qs), out)
	}
}

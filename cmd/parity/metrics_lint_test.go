package main

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// lintMetrics runs promtool's metric lint (promlint, what `promtool check metrics` runs)
// over a /metrics text and fails on any problem, and checks every parity_ metric has
// the changefeed label (parity_build_info excepted).
func lintMetrics(t *testing.T, text string) {
	t.Helper()
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatalf("linting /metrics: %v", err)
	}
	for _, p := range problems {
		t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
	}
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "parity_") || strings.HasPrefix(line, "parity_build_info") {
			continue
		}
		if !strings.Contains(line, `changefeed="`) {
			t.Errorf("metric without the changefeed label: %s", line)
		}
	}
}

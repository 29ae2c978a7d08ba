package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/testenv"
)

// TestRandomReplayKilled replays the TiCDC-made canal-json and simple changefeeds of
// ../shared/ticdc-random into `parity serve` with the matching protocol and SIGKILLs it
// three times mid-replay — once the applied checkpoint has passed a quarter, a half and
// three quarters of the dataset's watermarks — restarting it each time; the fallback
// must then equal final.jsonl.gz row for row and cell for cell. A restart resumes from
// offsets past DDLs, BOOTSTRAPs (simple) and the tables' CREATE TABLE: it needs the
// simple schema cache saved with the checkpoints and the definitions of tables the
// stream created before the restart read for their next DDL (before both, the restarted
// serve stopped with "no table schema for the row" or "has column …, which the table's
// definition lacks").
func TestRandomReplayKilled(t *testing.T) {
	root := randomDatasetsDir(t)
	for _, name := range []string{"canal-json-table", "simple-index-value"} {
		ds := loadRandomDataset(t, filepath.Join(root, name))
		t.Run(name, func(t *testing.T) { ds.replayKilled(t, []float64{0.25, 0.5, 0.75}) })
	}
}

// watermarkRe finds the ts of a canal-json or simple watermark record.
var watermarkRe = regexp.MustCompile(`"type":"(?:TIDB_)?WATERMARK".*"(?:watermarkTs|commitTs)":([0-9]+)|"(?:watermarkTs|commitTs)":([0-9]+).*"type":"(?:TIDB_)?WATERMARK"`)

// watermarks returns the distinct watermark ts of a canal-json or simple dataset, in
// order.
func (ds *randomDataset) watermarks(t *testing.T) []uint64 {
	t.Helper()
	var out []uint64
	for _, m := range ds.records {
		sm := watermarkRe.FindSubmatch(m.Value)
		if sm == nil {
			continue
		}
		s := sm[1]
		if len(s) == 0 {
			s = sm[2]
		}
		ts, err := strconv.ParseUint(string(s), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ts)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) < 10 || out[len(out)-1] != ds.lastResolved {
		t.Fatalf("%s: %d watermarks, the last %v, want it at the last resolved ts %d", ds.name, len(out), out[len(out)-1:], ds.lastResolved)
	}
	return out
}

// replayKilled produces every record, starts serve, and SIGKILLs and restarts it when
// its applied checkpoint passes each fraction of the dataset's watermarks.
func (ds *randomDataset) replayKilled(t *testing.T, at []float64) {
	start := time.Now()
	marks := ds.watermarks(t)
	mapped := testenv.UniqueName("rnd")
	target := func(s string) string {
		if s == "rnd" {
			return mapped
		}
		return s
	}
	down := openFallback(t, "+00:00")
	t.Cleanup(func() {
		if os.Getenv("PARITY_TEST_KEEP") != "1" {
			_, _ = down.Exec("DROP DATABASE IF EXISTS " + replayQuote(mapped))
		}
	})
	want := ds.want(t)
	e := newReplayEnv(t, ds.partitions, "+08:00")
	const workers, batchRows = 6, 2
	e.writeConfig(fmt.Sprintf("schema-map = { rnd = %q }\nprotocol = %q\n", mapped, ds.protocol), fmt.Sprintf("workers = %d\nbatch-rows = %d\n", workers, batchRows))
	produce(t, e, ds.records)
	s := e.startServe()
	var killedAt []string
	for _, f := range at {
		point := marks[int(f*float64(len(marks)-1))]
		applied := e.waitAppliedAtLeast(s, point, 2*time.Minute)
		if applied >= ds.lastResolved {
			t.Fatalf("%s: serve had applied the whole dataset (ts %d) when it was to be killed past %d: not mid-replay", ds.name, applied, point)
		}
		s.kill()
		killedAt = append(killedAt, fmt.Sprintf("%.0f%% (applied %d of %d watermarks)", f*100, countUpTo(marks, applied), len(marks)))
		s = e.startServe()
	}
	e.waitApplied(s, ds.lastResolved, 3*time.Minute)
	if errs := want.compare(t, down, target, ""); len(errs) > 0 {
		for _, msg := range errs {
			t.Error(msg)
		}
		t.Fatalf("%s: after SIGKILLs at %v the fallback differs from %s/final.jsonl.gz in %d places", ds.name, killedAt, ds.name, len(errs))
	}
	if ds.protocol == "simple" {
		// The decoder's checksum counts reach /metrics (daemon's collector): the last
		// serve verified the rows it read since its start.
		if v := e.metric(t, "parity_cdc_checksum_rows_verified_total"); v <= 0 {
			t.Errorf("parity_cdc_checksum_rows_verified_total = %v after the replay, want > 0", v)
		}
		if v := e.metric(t, "parity_cdc_checksum_mismatches_total"); v != 0 {
			t.Errorf("parity_cdc_checksum_mismatches_total = %v, want 0", v)
		}
	}
	s.stop(t)
	t.Logf("%s: %d records, %s; SIGKILLed at %v; whole run %v", ds.name, len(ds.records), want.summary(), killedAt, time.Since(start).Round(time.Millisecond))
}

// countUpTo is how many of the sorted marks are <= ts.
func countUpTo(marks []uint64, ts uint64) int {
	n, _ := slices.BinarySearch(marks, ts+1)
	return n
}

// waitAppliedAtLeast polls serve's status until its applied checkpoint is at least ts and
// returns it (as fine-grained as waitApplied, so that serve is killed soon after).
func (e *env) waitAppliedAtLeast(s *serve, ts uint64, timeout time.Duration) uint64 {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if done, err := s.exited(); done {
			e.t.Fatalf("parity serve exited (%v) before applying ts %d; log:\n%s", err, ts, e.serveLog())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := e.status(ctx)
		cancel()
		if err == nil {
			if st.State == "failed" {
				e.t.Fatalf("parity serve failed: %s; log:\n%s", st.Error, e.serveLog())
			}
			if st.AppliedTs >= ts {
				return st.AppliedTs
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.t.Fatalf("applied ts did not reach %d within %v; log:\n%s", ts, timeout, e.serveLog())
	return 0
}

// metric returns the value of a metric without labels other than changefeed from
// serve's /metrics (-1 when absent).
func (e *env) metric(t *testing.T, name string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.statusAddr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name+"{"); ok {
			if _, val, ok := strings.Cut(rest, "} "); ok {
				v, err := strconv.ParseFloat(val, 64)
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				return v
			}
		}
	}
	return -1
}

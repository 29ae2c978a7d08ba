package cdc

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/tidb-parity/parity/internal/testenv"
)

// BenchmarkDecodeProtocols decodes, with the decoder serve uses for each protocol, a
// changefeed made by TiCDC v8.5.6's own code (../shared/ticdc-random): random workloads of
// about 2,000 transactions over the same tables and statement mix, one per protocol
// (open-protocol table-a, canal-json canal-json-table, simple simple-index-value). It
// reports MB/s of record bytes (keys and values), events/s and allocations per event,
// then each protocol's ratio to the open protocol's (#34's target: no slower in MB/s).
// Run with GOMAXPROCS=1 for per-core figures.
func BenchmarkDecodeProtocols(b *testing.B) {
	cases := []struct{ protocol, dataset string }{
		{"open-protocol", "table-a"},
		{"canal-json", "canal-json-table"},
		{"simple", "simple-index-value"},
	}
	type result struct{ mbps, eps float64 }
	got := map[string]result{}
	for _, tc := range cases {
		recs := loadRandomRecords(b, tc.dataset)
		b.Run(tc.protocol, func(b *testing.B) {
			size := 0
			for _, r := range recs {
				size += len(r.key) + len(r.value)
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			cfg := DefaultConfig()
			cfg.Changefeed.Protocol = tc.protocol
			dec, err := newRecordDecoder(cfg)
			if err != nil {
				b.Fatal(err)
			}
			var events uint64
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			mallocs := ms.Mallocs
			for b.Loop() {
				// The simple protocol's schemas come from the changefeed's own BOOTSTRAP
				// and DDL records, met again on each pass.
				for i, r := range recs {
					evs, err := dec.Decode(r.key, r.value)
					if err != nil {
						b.Fatalf("%s record %d: %v", tc.dataset, i, err)
					}
					events += uint64(len(evs))
				}
			}
			runtime.ReadMemStats(&ms)
			secs := b.Elapsed().Seconds()
			eps := float64(events) / secs
			b.ReportMetric(eps, "events/s")
			b.ReportMetric(float64(ms.Mallocs-mallocs)/float64(events), "allocs/event")
			got[tc.protocol] = result{mbps: float64(size) * float64(b.N) / secs / 1e6, eps: eps}
		})
	}
	base, ok := got["open-protocol"]
	if !ok || base.mbps == 0 {
		return
	}
	for _, tc := range cases[1:] {
		r, ok := got[tc.protocol]
		if !ok {
			continue
		}
		fmt.Printf("decode %s against open-protocol (TiCDC-made changefeeds): %.0f vs %.0f MB/s = %.2fx (target >= 1); %.0f vs %.0f events/s = %.2fx\n",
			tc.protocol, r.mbps, base.mbps, r.mbps/base.mbps, r.eps, base.eps, r.eps/base.eps)
	}
}

type randomRecord struct{ key, value []byte }

// loadRandomRecords reads records.jsonl.gz of one dataset of ../shared/ticdc-random, in
// file order (the partitions interleaved as TiCDC sent them).
func loadRandomRecords(tb testing.TB, dataset string) []randomRecord {
	tb.Helper()
	path := filepath.Join(testenv.RandomDatasetsDir(), dataset, "records.jsonl.gz")
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("TiCDC random dataset: %v", err)
		}
		tb.Skipf("TiCDC random dataset: %v", err)
	}
	var out []randomRecord
	testenv.GzipLines(tb, path, func(line []byte) {
		var r struct{ Key, Value []byte } // base64 in the file
		if err := json.Unmarshal(line, &r); err != nil {
			tb.Fatalf("%s line %d: %v", path, len(out)+1, err)
		}
		out = append(out, randomRecord{key: r.Key, value: r.Value})
	})
	if len(out) == 0 {
		tb.Fatalf("%s: no records", path)
	}
	return out
}

package simple

import (
	"runtime"
	"strings"
	"testing"
)

// BenchmarkDecode decodes the TiCDC-made corpus's row records (every table, with and
// without checksums, each verified), reporting MB/s of record values and the
// allocations per event (which do not depend on the machine).
func BenchmarkDecode(b *testing.B) {
	d, recs := corpusDecoder(b)
	var values [][]byte
	size := 0
	for _, r := range recs {
		if strings.HasPrefix(r.Name[4:], "row-") {
			values = append(values, []byte(r.Value))
			size += len(r.Value)
		}
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs := ms.Mallocs
	for b.Loop() {
		for _, v := range values {
			if _, err := d.Decode(nil, v); err != nil {
				b.Fatal(err)
			}
		}
	}
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(len(values)*b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(ms.Mallocs-mallocs)/float64(len(values)*b.N), "allocs/event")
}

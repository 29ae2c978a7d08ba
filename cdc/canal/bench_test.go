package canal

import (
	"runtime"
	"testing"
)

// BenchmarkDecode decodes the TiCDC-made corpus's records (rows of every table, DDLs,
// watermarks), reporting MB/s of record values and rows/s, for make bench beside the
// open protocol's and simple's decoders, and the allocations per event (which do not
// depend on the machine).
func BenchmarkDecode(b *testing.B) {
	recs := loadCorpus(b)
	d, err := NewDecoder(DecoderConfig{})
	if err != nil {
		b.Fatal(err)
	}
	values := make([][]byte, len(recs))
	size := 0
	for i, r := range recs {
		values[i] = []byte(r.Value)
		size += len(r.Value)
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	rows := 0
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs := ms.Mallocs
	for b.Loop() {
		for _, v := range values {
			evs, err := d.Decode(nil, v)
			if err != nil {
				b.Fatal(err)
			}
			rows += len(evs)
		}
	}
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "events/s")
	b.ReportMetric(float64(ms.Mallocs-mallocs)/float64(rows), "allocs/event")
}

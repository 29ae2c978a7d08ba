//go:build !race

// The race detector adds allocations of its own.

package open

import "testing"

// TestDecodeAllocations pins issue 32's target (at most 5 allocations per event) and
// what the decoder does today: 5 allocations per record when decoding the 16-event
// all-types record of BenchmarkDecode, with every compression — the events, the
// columns, the text, the bytes and one struct of every boxed value (package values;
// 9 before it, with one array per Go type). The count does not depend on the machine's
// speed or load.
func TestDecodeAllocations(t *testing.T) {
	const perEvent, perRecord = 5, 5
	for _, comp := range fuzzCompressions {
		t.Run(string(comp), func(t *testing.T) {
			m := allTypesBatch(t, comp)
			d, err := NewDecoder(DecoderConfig{Compression: comp})
			if err != nil {
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(50, func() {
				if evs, err := d.Decode(m.Key, m.Value); err != nil || len(evs) != m.Events {
					t.Fatalf("%d events, %v", len(evs), err)
				}
			})
			if got := allocs / float64(m.Events); got > perEvent || allocs > perRecord {
				t.Errorf("%.1f allocations per event (%.0f per record of %d), want at most %d (%d a record)", got, allocs, m.Events, perEvent, perRecord)
			} else {
				t.Logf("%.2f allocations per event (%.0f per record of %d)", got, allocs, m.Events)
			}
		})
	}
}

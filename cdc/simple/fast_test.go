package simple

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
)

// fastThenSlow decodes value with the fast path alone, then with decodeSlow, and
// returns both results with what each added to the counters.
func fastThenSlow(d *Decoder, value []byte) (fast []open.Event, ok bool, fastStats Stats, slow []open.Event, err error, slowStats Stats) {
	diff := func(a, b Stats) Stats {
		return Stats{b.RowsVerified - a.RowsVerified, b.RowsWithoutChecksum - a.RowsWithoutChecksum, b.Mismatches - a.Mismatches}
	}
	s0 := d.Stats()
	st := d.state()
	fast, ok = st.decode(d, value)
	d.release(st)
	s1 := d.Stats()
	slow, err = d.decodeSlow(value)
	return fast, ok, diff(s0, s1), slow, err, diff(s1, d.Stats())
}

// TestFastPath: the fast path decodes every row and watermark record of the TiCDC-made
// corpus itself (none is left to decodeSlow), with and without a TimeZone, and gives
// exactly the events and the counts decodeSlow gives.
func TestFastPath(t *testing.T) {
	for _, zone := range []*time.Location{nil, time.UTC} {
		d, recs := corpusDecoder(t)
		d.cfg.TimeZone = zone
		for range 2 {
			for _, r := range recs {
				if !strings.HasPrefix(r.Name[4:], "row-") && r.Name[4:] != "watermark" {
					continue
				}
				fast, ok, fs, slow, err, ss := fastThenSlow(d, []byte(r.Value))
				if !ok || err != nil {
					t.Fatalf("%s: fast path %v, slow path %v", r.Name, ok, err)
				}
				if !reflect.DeepEqual(fast, slow) || fs != ss {
					t.Fatalf("%s: fast path (%+v)\n%+v\nslow path (%+v)\n%+v", r.Name, fs, fast, ss, slow)
				}
			}
		}
	}
}

// TestFastPathWatermark: the fast path decodes a WATERMARK as decodeSlow does and leaves
// every one it cannot be sure of to it (decodeSlow's error or reading then stands).
func TestFastPathWatermark(t *testing.T) {
	d, _ := corpusDecoder(t)
	for _, tc := range []struct {
		value string
		fast  bool // the fast path decodes it
	}{
		{`{"version":1,"type":"WATERMARK","commitTs":470780676110548992,"buildTs":1795885757872}`, true},
		{`{"type":"WATERMARK","version":1,"commitTs":18446744073709551615}`, true},
		{`{"version":1,"type":"WATERMARK","commitTs":7,"database":"","table":null,"data":null,"extra":[1,{}]}`, true},
		{`{"version":1,"type":"WATERMARK","buildTs":1}`, false},                     // no commitTs: decodeSlow's error
		{`{"version":1,"type":"WATERMARK","commitTs":null}`, false},                 // likewise
		{`{"version":2,"type":"WATERMARK","commitTs":7}`, false},                    // another version
		{`{"type":"WATERMARK","commitTs":7}`, false},                                // no version
		{`{"version":1,"type":"WATERMARK","commitTs":"7"}`, false},                  // a string
		{`{"version":1,"type":"WATERMARK","commitTs":18446744073709551616}`, false}, // out of range
		{`{"version":1,"type":"WATERMARK","commitTs":7,"commitTs":8}`, false},       // twice
		{`{"version":1,"type":"WATERMARK","CommitTs":7}`, false},                    // folded name
		{`{"version":1,"type":"WATERMARK","commitTs":7}x`, false},                   // trailing bytes
	} {
		fast, ok, fs, slow, err, ss := fastThenSlow(d, []byte(tc.value))
		if ok != tc.fast {
			t.Errorf("%s: fast path decoded it: %v, want %v", tc.value, ok, tc.fast)
			continue
		}
		if !ok {
			continue
		}
		want := []open.Event{{Kind: open.KindResolved, CommitTs: fast[0].CommitTs}}
		if err != nil || !reflect.DeepEqual(fast, slow) || fs != ss || len(fast) != 1 || !reflect.DeepEqual(fast, want) {
			t.Errorf("%s: fast path %+v (%+v), slow path %+v (%+v), %v", tc.value, fast, fs, slow, ss, err)
		}
	}
}

// FuzzFastPath: whatever the fast path decodes, decodeSlow decodes to the same events
// and counts alike; what it does not decode it leaves untouched (no count).
func FuzzFastPath(f *testing.F) {
	d, recs := corpusDecoder(f)
	for _, r := range recs {
		f.Add([]byte(r.Value))
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		fast, ok, fs, slow, err, ss := fastThenSlow(d, value)
		if !ok {
			if fs != (Stats{}) {
				t.Fatalf("the fast path gave up but counted %+v", fs)
			}
			return
		}
		if err != nil {
			t.Fatalf("the fast path decoded %+v, the slow path failed: %v", fast, err)
		}
		if !reflect.DeepEqual(fast, slow) || fs != ss {
			t.Fatalf("fast path (%+v)\n%+v\nslow path (%+v)\n%+v", fs, fast, ss, slow)
		}
	})
}

// TestConcurrentDecode: one Decoder serves several goroutines (each call takes a state
// of its own); every one decodes the corpus rows to the same events as decodeSlow.
func TestConcurrentDecode(t *testing.T) {
	d, recs := corpusDecoder(t)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for range 10 {
				for _, r := range recs {
					if !strings.HasPrefix(r.Name[4:], "row-") {
						continue
					}
					got, err := d.Decode(nil, []byte(r.Value))
					want, _ := d.decodeSlow([]byte(r.Value))
					if err != nil || !reflect.DeepEqual(got, want) {
						errs <- fmt.Errorf("%s: %v, events differ: %v", r.Name, err, !reflect.DeepEqual(got, want))
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

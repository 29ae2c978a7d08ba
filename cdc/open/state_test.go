package open

import (
	"fmt"
	"reflect"
	"sync"
	"testing"
)

// TestDecodeSharedScratch decodes every corpus record many times from several goroutines
// through one Decoder per compression (the replicator shares one across partitions), and
// checks that each result equals the record's first decode, and that the events returned
// first are still intact after all the later calls reused the scratch: nothing a caller
// gets may alias a decoder's scratch.
func TestDecodeSharedScratch(t *testing.T) {
	type rec struct {
		key, value []byte
		dec        *Decoder
		want       []Event
	}
	decoders := map[string]*Decoder{}
	var recs []rec
	for _, c := range loadCorpus(t) {
		d := decoders[c.Encoder.Compression]
		if d == nil {
			d = c.decoder(t, true)
			decoders[c.Encoder.Compression] = d
		}
		for _, m := range c.Messages {
			k, v := c.read(t, m.KeyFile), c.read(t, m.ValueFile)
			want, err := d.Decode(k, v)
			if err != nil {
				t.Fatalf("%s: %v", c.Name, err)
			}
			recs = append(recs, rec{k, v, d, want})
		}
	}
	snapshot := fmt.Sprintf("%#v", recs)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 40 * len(recs) {
				r := recs[(i*7+g)%len(recs)]
				got, err := r.dec.Decode(r.key, r.value)
				if err != nil || !reflect.DeepEqual(got, r.want) {
					errs <- fmt.Errorf("goroutine %d call %d: %v\n got %#v\nwant %#v", g, i, err, got, r.want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if fmt.Sprintf("%#v", recs) != snapshot {
		t.Error("events returned by earlier calls changed during later calls")
	}
}

package canal

import (
	"errors"
	"reflect"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

// FuzzDecode feeds arbitrary values to the decoder, seeded with the TiCDC-made corpus.
// Decoding must never panic; an error must be a *DecodeError with no events; a value
// that decodes gives events of a known kind, rows with columns, binary values that
// render back to the ISO-8859-1 text they came from, and the same events when decoded
// again.
func FuzzDecode(f *testing.F) {
	for _, r := range loadCorpus(f) {
		f.Add([]byte(r.Value))
	}
	f.Add([]byte(`{"table":"t","type":"UPDATE","pkNames":["k"],"mysqlType":{"k":"varbinary","u":"bigint unsigned","f":"float"},"data":[{"k":"\u00ff\u0000","u":"18446744073709551615","f":"1e38"}],"old":[{"k":"a","u":null,"f":"-0"}],"_tidb":{"commitTs":9,"onlyHandleKey":true}}`))
	f.Fuzz(func(t *testing.T, value []byte) {
		d, err := NewDecoder(DecoderConfig{MaxMessageBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		evs, err := d.Decode(nil, value)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T is not a *DecodeError: %v", err, err)
			}
			if evs != nil {
				t.Fatalf("%d events with an error", len(evs))
			}
			_ = err.Error()
			return
		}
		if len(evs) == 0 {
			t.Fatal("no events and no error")
		}
		for _, ev := range evs {
			switch ev.Kind {
			case open.KindResolved:
			case open.KindDDL:
				if ev.Query == "" || ev.CommitTs == 0 {
					t.Fatalf("DDL without query or ts: %+v", ev)
				}
			case open.KindRow:
				if len(ev.Columns) == 0 || ev.Table == "" || ev.CommitTs == 0 || (ev.Op == open.OpUpdate) != (ev.OldColumns != nil) {
					t.Fatalf("bad row event: %+v", ev)
				}
				for _, c := range append(ev.Columns, ev.OldColumns...) {
					if b, ok := c.Value.([]byte); ok {
						r := make([]rune, len(b))
						for i, x := range b {
							r[i] = rune(x)
						}
						if back, err := latin1(string(r)); err != nil || !reflect.DeepEqual(back, b) {
							t.Fatalf("column %s: bytes %x do not round-trip through ISO-8859-1", c.Name, b)
						}
					}
				}
			default:
				t.Fatalf("event of kind %v", ev.Kind)
			}
		}
		again, err := d.Decode(nil, value)
		if err != nil || !reflect.DeepEqual(again, evs) {
			t.Fatalf("decoding again: %v, equal %v", err, reflect.DeepEqual(again, evs))
		}
	})
}

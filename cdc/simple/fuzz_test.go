package simple

import (
	"bytes"
	"errors"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

// corpusDecoder returns a decoder that has decoded every corpus record (so its cache
// holds every schema), with the records.
func corpusDecoder(tb testing.TB) (*Decoder, []corpusRecord) {
	tb.Helper()
	recs := readJSONL[corpusRecord](tb, corpusRecords)
	d, err := NewDecoder(DefaultDecoderConfig())
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range recs {
		if _, err := d.Decode(nil, []byte(r.Value)); err != nil {
			tb.Fatalf("%s: %v", r.Name, err)
		}
	}
	return d, recs
}

// FuzzDecode feeds arbitrary values (seeded with the TiCDC-made corpus) to a decoder
// whose cache holds the corpus's schemas. Decoding must never panic; an error is a
// *DecodeError or a *ChecksumError and comes without events; a mismatch is counted; a
// decoded row has every column of its schema.
func FuzzDecode(f *testing.F) {
	d, recs := corpusDecoder(f)
	for _, r := range recs {
		f.Add([]byte(r.Value))
	}
	f.Add([]byte(`{"version":1,"type":"WATERMARK","commitTs":1}`))
	f.Add([]byte(`{"version":1,"database":"rnd","table":"nope","type":"INSERT","commitTs":1,"schemaVersion":1,"data":{}}`))
	f.Fuzz(func(t *testing.T, value []byte) {
		before := d.Stats()
		evs, err := d.Decode(nil, value)
		after := d.Stats()
		if err != nil {
			var de *DecodeError
			var ce *ChecksumError
			switch {
			case errors.As(err, &ce):
				if after.Mismatches == before.Mismatches {
					t.Fatal("a ChecksumError not counted")
				}
				if ce.Table == "" || ce.Key == "" {
					t.Fatalf("ChecksumError without table: %v", err)
				}
			case errors.As(err, &de):
			default:
				t.Fatalf("error %T is neither a *DecodeError nor a *ChecksumError: %v", err, err)
			}
			if evs != nil {
				t.Fatalf("%d events with an error", len(evs))
			}
			_ = err.Error()
			return
		}
		if evs == nil {
			t.Fatal("no events slice and no error")
		}
		for _, ev := range evs {
			if ev.Kind == open.KindRow {
				if len(ev.Columns) == 0 {
					t.Fatal("a row without columns")
				}
				if ev.Op == open.OpUpdate && len(ev.OldColumns) != len(ev.Columns) && !ev.OnlyHandleKey {
					t.Fatalf("update with %d old and %d new columns", len(ev.OldColumns), len(ev.Columns))
				}
			}
		}
	})
}

// FuzzCorruptValue changes one byte of one column value of a checksummed row image of
// the corpus: the result must be an error (the checksum's, or the record no longer
// decodes) or decode to exactly the original event (the byte changed nothing the row
// holds, e.g. a DOUBLE digit past float64's precision). Anything else is a corrupted
// row the checksum let through.
func FuzzCorruptValue(f *testing.F) {
	d, recs := corpusDecoder(f)
	type target struct {
		value []byte
		spans []span
		orig  []open.Event
	}
	var targets []target
	for _, r := range recs {
		v := []byte(r.Value)
		if !bytes.Contains(v, []byte(`"checksum":`)) {
			continue
		}
		has := checksummed(f, v)
		var ss []span
		for _, s := range valueSpans(f, v) {
			if has[s.image] && s.end > s.start {
				ss = append(ss, s)
			}
		}
		if len(ss) == 0 {
			continue
		}
		orig, err := d.Decode(nil, v)
		if err != nil {
			f.Fatal(err)
		}
		targets = append(targets, target{v, ss, orig})
	}
	if len(targets) == 0 {
		f.Fatal("no checksummed rows in the corpus")
	}
	for i := range 16 {
		f.Add(uint16(i*7), uint16(i*13), uint16(i*31), byte(i*17))
	}
	f.Fuzz(func(t *testing.T, rec, col, off uint16, b byte) {
		tg := targets[int(rec)%len(targets)]
		s := tg.spans[int(col)%len(tg.spans)]
		pos := s.start + int(off)%(s.end-s.start)
		if tg.value[pos] == b {
			return
		}
		if corrupt(t, d, tg.value, pos, b, tg.orig) == missed {
			bad := bytes.Clone(tg.value)
			bad[pos] = b
			evs, _ := d.Decode(nil, bad)
			t.Fatalf("%s.%s byte %d %q→%q decoded without error to a different row:\n got %+v\nwant %+v",
				s.image, s.column, pos, tg.value[pos], b, evs, tg.orig)
		}
	})
}

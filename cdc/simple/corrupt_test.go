package simple

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
)

// span is the content (between the quotes) of one JSON string holding a column value:
// a row image's column, or the location or value of a TIMESTAMP.
type span struct {
	image  string // "data" or "old"
	column string
	start  int
	end    int
}

// valueSpans lists the string column values of a row record's row images.
func valueSpans(tb testing.TB, value []byte) []span {
	tb.Helper()
	dec := json.NewDecoder(bytes.NewReader(value))
	tok := func() json.Token {
		t, err := dec.Token()
		if err != nil {
			tb.Fatalf("scan record: %v", err)
		}
		return t
	}
	// str reads a string value right after a key; no whitespace in TiCDC's compact JSON.
	var spans []span
	str := func(image, column string) bool {
		start := int(dec.InputOffset()) + 1 // after the ':'
		t := tok()
		switch t.(type) {
		case string:
			if value[start] != '"' {
				tb.Fatalf("value of %s.%s at %d is not where expected", image, column, start)
			}
			spans = append(spans, span{image, column, start + 1, int(dec.InputOffset()) - 1})
			return true
		case json.Delim:
			return false
		}
		return true
	}
	if d, ok := tok().(json.Delim); !ok || d != '{' {
		tb.Fatal("record is not an object")
	}
	for dec.More() {
		key := tok().(string)
		if key != "data" && key != "old" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				tb.Fatal(err)
			}
			continue
		}
		if d, ok := tok().(json.Delim); !ok || d != '{' {
			continue // null
		}
		for dec.More() {
			col := tok().(string)
			if !str(key, col) { // a TIMESTAMP object
				for dec.More() {
					tok() // "location" / "value"
					str(key, col)
				}
				tok() // '}'
			}
		}
		tok() // '}'
	}
	return spans
}

// checksummed returns the record's images that carry a checksum.
func checksummed(tb testing.TB, value []byte) map[string]bool {
	var m struct {
		Type     string        `json:"type"`
		Checksum *wireChecksum `json:"checksum"`
	}
	if err := json.Unmarshal(value, &m); err != nil {
		tb.Fatal(err)
	}
	out := map[string]bool{}
	if m.Checksum != nil {
		out["data"] = m.Checksum.Current != 0
		out["old"] = m.Checksum.Previous != 0
	}
	return out
}

// primedDecoder returns a decoder whose cache holds every schema of the dataset.
func primedDecoder(tb testing.TB, recs []datasetRecord) *Decoder {
	d, err := NewDecoder(DefaultDecoderConfig())
	if err != nil {
		tb.Fatal(err)
	}
	for i, r := range recs {
		if _, err := d.LearnSchema(r.Value); err != nil {
			tb.Fatalf("record %d: %v", i, err)
		}
	}
	return d
}

// TestCorruptedValueStops flips one byte of one column value of a TiCDC-made record
// (the checksum unchanged): the decoder returns a *ChecksumError naming the record's
// table and key, and the caller's Kafka coordinates.
func TestCorruptedValueStops(t *testing.T) {
	recs := loadDataset(t)
	d := primedDecoder(t, recs)
	tests := []struct {
		name    string
		table   string
		op      string
		column  string
		keyless bool // the key is the whole (corrupted) row
	}{
		{"a digit of an INT in an insert", "t_int", "INSERT", "v", false},
		{"a letter of a VARCHAR key's row in an update", "t_vc_bin", "UPDATE", "note", false},
		{"a base64 character of a BLOB", "t_types", "INSERT", "c_blob", false},
		{"a digit of a TIMESTAMP", "t_types", "UPDATE", "c_ts", false},
		{"a digit of a DECIMAL in a delete", "t_types", "DELETE", "c_dec", false},
		{"a digit of a JSON document in the old image of an update", "t_types", "UPDATE", "c_json", false},
		{"a digit of a keyless row", "t_nokey", "INSERT", "a", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i, r := range recs {
				if r.Kind != "row" || !bytes.Contains(r.Value, []byte(`"table":"`+tc.table+`"`)) ||
					!bytes.Contains(r.Value, []byte(`"type":"`+tc.op+`"`)) {
					continue
				}
				has := checksummed(t, r.Value)
				spans := valueSpans(t, r.Value)
				for j, s := range spans {
					// The last span of the column: a TIMESTAMP's value follows its location.
					if s.column != tc.column || !has[s.image] || s.end-s.start < 2 ||
						(j+1 < len(spans) && spans[j+1].column == s.column && spans[j+1].image == s.image) {
						continue
					}
					if tc.column == "c_json" && s.image != "old" {
						continue
					}
					orig, err := d.Decode(nil, r.Value)
					if err != nil {
						t.Fatal(err)
					}
					bad := bytes.Clone(r.Value)
					// A digit, letter or base64 character mid-value (a base64 value's last
					// character may hold padding bits, which strict decoding refuses).
					pos := s.start + (s.end-s.start)/2
					for pos > s.start && !isAlnum(r.Value[pos]) {
						pos--
					}
					bad[pos] = flipSameClass(bad[pos])
					if bytes.Equal(bad, r.Value) {
						continue
					}
					_, err = d.Decode(nil, bad)
					err = WithRecord(err, "cdc-simple", r.Partition, int64(i))
					var ce *ChecksumError
					if !errors.As(err, &ce) {
						t.Fatalf("record %d with %s.%s byte %d changed %q→%q: got %v, want a *ChecksumError", i, s.image, s.column, pos,
							r.Value[pos], bad[pos], err)
					}
					if !errors.Is(err, ErrChecksum) {
						t.Errorf("error does not wrap ErrChecksum: %v", err)
					}
					wantImage := map[string]string{"data": "new", "old": "old"}[s.image]
					key := keyString(mustTable(t, d, orig[0]), pick(orig[0], s.image))
					if tc.keyless {
						// The whole row, as received: the corrupted value in it.
						if ce.Key == key || !strings.HasPrefix(ce.Key, "a=") || !strings.Contains(ce.Key, ", b=") || !strings.Contains(ce.Key, ", c=") {
							t.Errorf("keyless key (%s): want every column, the corrupted value in place of (%s)", ce.Key, key)
						}
						key = ce.Key
					}
					if ce.Schema != "rnd" || ce.Table != tc.table || ce.Key != key || ce.Image != wantImage || ce.CommitTs != orig[0].CommitTs {
						t.Errorf("error names %s.%s key (%s) image %s ts %d; want rnd.%s key (%s) image %s ts %d",
							ce.Schema, ce.Table, ce.Key, ce.Image, ce.CommitTs, tc.table, key, wantImage, orig[0].CommitTs)
					}
					msg := err.Error()
					for _, want := range []string{"rnd." + tc.table, key, fmt.Sprintf("topic cdc-simple partition %d offset %d", r.Partition, i)} {
						if !strings.Contains(msg, want) {
							t.Errorf("error %q does not name %q", msg, want)
						}
					}
					t.Logf("%v", err)
					if d.Stats().Mismatches == 0 {
						t.Error("the mismatch was not counted")
					}
					return
				}
			}
			t.Fatalf("no %s record of %s with a checksummed %s value", tc.op, tc.table, tc.column)
		})
	}
}

// TestCorruptedFlagStops: a row TiCDC flagged corrupted is an error like a mismatch.
func TestCorruptedFlagStops(t *testing.T) {
	recs := loadDataset(t)
	d := primedDecoder(t, recs)
	for i, r := range recs {
		if r.Kind != "row" || !bytes.Contains(r.Value, []byte(`"corrupted":false`)) {
			continue
		}
		orig, err := d.Decode(nil, r.Value)
		if err != nil {
			t.Fatal(err)
		}
		bad := bytes.Replace(r.Value, []byte(`"corrupted":false`), []byte(`"corrupted":true`), 1)
		_, err = d.Decode(nil, bad)
		var ce *ChecksumError
		if !errors.As(err, &ce) || !ce.Corrupted || !errors.Is(err, ErrCorrupted) {
			t.Fatalf("record %d flagged corrupted: got %v", i, err)
		}
		if ce.Table != orig[0].Table || ce.Key == "" || !strings.Contains(err.Error(), "corrupted") {
			t.Errorf("error %v does not name the table %s and key", err, orig[0].Table)
		}
		return
	}
	t.Fatal("no row with a checksum")
}

func mustTable(t *testing.T, d *Decoder, ev open.Event) *table {
	t.Helper()
	d.mu.RLock()
	defer d.mu.RUnlock()
	for k, c := range d.tables {
		if k.schema == ev.Schema && k.table == ev.Table && c.t != nil {
			return c.t
		}
	}
	t.Fatalf("no schema for %s.%s", ev.Schema, ev.Table)
	return nil
}

func pick(ev open.Event, image string) []open.Column {
	if image == "old" && ev.Op == open.OpUpdate {
		return ev.OldColumns
	}
	return ev.Columns
}

// flipSameClass changes a digit to another digit and a letter to another letter, so the
// record stays valid and only the checksum can tell.
func flipSameClass(c byte) byte {
	switch {
	case c >= '0' && c <= '8', c >= 'a' && c <= 'y', c >= 'A' && c <= 'Y':
		return c + 1
	case c == '9':
		return '0'
	case c == 'z':
		return 'a'
	case c == 'Z':
		return 'A'
	}
	return c ^ 0x01
}

func isAlnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// corruptionOutcome classifies one corrupted record.
type corruptionOutcome int

const (
	caughtByChecksum corruptionOutcome = iota // a *ChecksumError
	caughtByDecode                            // the record no longer decodes (*DecodeError)
	unchanged                                 // decodes to the same event: nothing was corrupted
	missed                                    // decodes, no error, a different event
)

func corrupt(tb testing.TB, d *Decoder, value []byte, pos int, b byte, orig []open.Event) corruptionOutcome {
	bad := bytes.Clone(value)
	bad[pos] = b
	evs, err := d.Decode(nil, bad)
	var ce *ChecksumError
	var de *DecodeError
	switch {
	case errors.As(err, &ce):
		return caughtByChecksum
	case errors.As(err, &de):
		return caughtByDecode
	case err != nil:
		tb.Fatalf("error of type %T: %v", err, err)
	}
	if reflect.DeepEqual(evs, orig) {
		return unchanged
	}
	return missed
}

// TestCorruptionCatchRate flips one random byte of one column value (to a random other
// byte) in records of the TiCDC-made changefeed whose image carries a checksum, many
// times, and requires that at least 99.9 % of the corrupted rows are caught. A flip
// that decodes to the same row (a DOUBLE digit past float64's precision) corrupted
// nothing and is reported apart.
func TestCorruptionCatchRate(t *testing.T) {
	recs := loadDataset(t)
	d := primedDecoder(t, recs)
	rng := rand.New(rand.NewPCG(112, 34))
	type target struct {
		rec   int
		spans []span
		orig  []open.Event
	}
	var targets []target
	for i, r := range recs {
		if r.Kind != "row" {
			continue
		}
		has := checksummed(t, r.Value)
		var ss []span
		for _, s := range valueSpans(t, r.Value) {
			if has[s.image] && s.end > s.start {
				ss = append(ss, s)
			}
		}
		if len(ss) == 0 {
			continue
		}
		orig, err := d.Decode(nil, r.Value)
		if err != nil {
			t.Fatal(err)
		}
		targets = append(targets, target{i, ss, orig})
	}
	trials := 60000
	if testing.Short() {
		trials = 5000
	}
	var n [4]int
	var misses []string
	for range trials {
		tg := targets[rng.IntN(len(targets))]
		s := tg.spans[rng.IntN(len(tg.spans))]
		pos := s.start + rng.IntN(s.end-s.start)
		old := recs[tg.rec].Value[pos]
		b := byte(rng.IntN(255))
		if b >= old {
			b++
		}
		o := corrupt(t, d, recs[tg.rec].Value, pos, b, tg.orig)
		n[o]++
		if o == missed && len(misses) < 10 {
			misses = append(misses, fmt.Sprintf("record %d %s.%s byte %d %q→%q", tg.rec, s.image, s.column, pos, old, b))
		}
	}
	corrupted := n[caughtByChecksum] + n[caughtByDecode] + n[missed]
	rate := float64(n[caughtByChecksum]+n[caughtByDecode]) / float64(corrupted)
	valid := n[caughtByChecksum] + n[missed] // corruptions that still decode
	t.Logf("%d one-byte corruptions of checksummed column values in %d records: caught %.4f%% of %d corrupted rows (%d by the checksum, %d no longer decode), %d missed; %d decoded unchanged (not corrupted); of the %d that still decode, the checksum caught %.4f%%",
		trials, len(targets), 100*rate, corrupted, n[caughtByChecksum], n[caughtByDecode], n[missed], n[unchanged],
		valid, 100*float64(n[caughtByChecksum])/float64(valid))
	if rate < 0.999 {
		t.Errorf("catch rate %.4f%% < 99.9%%; missed: %s", 100*rate, strings.Join(misses, "; "))
	}
	if n[caughtByChecksum] == 0 {
		t.Error("no corruption was caught by the checksum")
	}
}

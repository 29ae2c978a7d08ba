package open

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
)

var fuzzCompressions = []Compression{CompressionNone, CompressionSnappy, CompressionLZ4}

// FuzzDecode feeds arbitrary records to the decoder (seeded with every corpus record and
// its compression). Decoding must never panic; an error must be a *DecodeError; and a
// record that decodes must re-encode to records that decode to the same events.
func FuzzDecode(f *testing.F) {
	for _, c := range loadCorpus(f) {
		mode := uint8(slices.Index(fuzzCompressions, Compression(c.Encoder.Compression)))
		for _, m := range c.Messages {
			f.Add(c.read(f, m.KeyFile), c.read(f, m.ValueFile), mode)
		}
	}
	k, v := record([]string{rowKey, `{"ts":2,"t":3}`, `{"ts":3,"scm":"s","t":2}`},
		[]string{row(`{"t":15,"f":1,"v":"\\x00a\"\\u00e9"}`), "", `{"q":"CREATE DATABASE s","t":1}`})
	f.Add(k, v, uint8(0))
	f.Fuzz(func(t *testing.T, key, value []byte, mode uint8) {
		comp := fuzzCompressions[int(mode)%len(fuzzCompressions)]
		d, err := NewDecoder(DecoderConfig{Compression: comp, KeepClaimCheck: true, MaxPayloadBytes: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		evs, err := d.Decode(key, value)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T is not a *DecodeError: %v", err, err)
			}
			if evs != nil {
				t.Fatalf("%d events returned with an error", len(evs))
			}
			_ = err.Error()
			return
		}
		if len(evs) == 0 {
			t.Fatal("no events and no error")
		}
		roundTrip(t, d, comp, evs)
	})
}

// roundTrip encodes evs and checks that the records decode to the same events.
func roundTrip(t *testing.T, d *Decoder, comp Compression, evs []Event) {
	t.Helper()
	enc, err := NewEncoder(EncoderConfig{Compression: comp, MaxBatchSize: 1 << 20, MaxMessageBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	// The encoder keeps only the handle-key columns of a handle-key-only row: the round
	// trip stops there, but the events before it must still encode.
	if n := slices.IndexFunc(evs, func(ev Event) bool { return ev.Kind == KindRow && ev.OnlyHandleKey }); n >= 0 {
		encodeAll(t, enc, evs[:n])
		return
	}
	msgs := encodeAll(t, enc, evs)
	var again []Event
	for _, m := range msgs {
		got, err := d.Decode(m.Key, m.Value)
		if err != nil {
			t.Fatalf("decode re-encoded record: %v\nkey %q\nvalue %q", err, m.Key, m.Value)
		}
		again = append(again, got...)
	}
	want := canonical(evs)
	got := canonical(again)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip changed the events:\n got %+v\nwant %+v", got, want)
	}
}

// canonical drops what the wire does not carry for an event's kind and sorts columns by
// name (the classic encoder writes maps sorted).
func canonical(evs []Event) []Event {
	out := make([]Event, len(evs))
	for i, ev := range evs {
		ev.Malformed = nil
		switch ev.Kind {
		case KindResolved:
			ev = Event{Kind: KindResolved, CommitTs: ev.CommitTs}
		case KindDDL:
			ev.OnlyHandleKey, ev.ClaimCheckLocation = false, ""
		case KindRow:
			sortCols := func(c []Column) []Column {
				c = slices.Clone(c)
				slices.SortStableFunc(c, func(a, b Column) int { return strings.Compare(a.Name, b.Name) })
				return c
			}
			ev.Columns, ev.OldColumns = sortCols(ev.Columns), sortCols(ev.OldColumns)
		}
		out[i] = ev
	}
	return out
}

// FuzzQuoted checks the binary-string codec against strconv: encoding is strconv.Quote,
// decoding must agree with strconv.Unquote.
func FuzzQuoted(f *testing.F) {
	for _, s := range []string{"", "a", `\x00\xff`, `\"`, `\u00e9`, `\U0001F600`, `\101`, `\'`, "é\x80", `\`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := strconv.Quote(s)
		back, err := goUnquote([]byte(q[1 : len(q)-1]))
		if err != nil || string(back) != s {
			t.Fatalf("goUnquote(Quote(%q)) = %q, %v", s, back, err)
		}
		want, werr := strconv.Unquote(`"` + s + `"`)
		got, gerr := goUnquote([]byte(s))
		if (werr == nil) != (gerr == nil) || (werr == nil && string(got) != want) {
			t.Fatalf("goUnquote(%q) = %q, %v; strconv.Unquote = %q, %v", s, got, gerr, want, werr)
		}
	})
}

// FuzzJSONString checks the classic string encoder against encoding/json and the scanner
// against encoding/json's decoding.
func FuzzJSONString(f *testing.F) {
	for _, s := range []string{"", "<a&b>", "\u2028\u2029", "\x00\x1f\b\f", "é\xff", `"\`, "\U0001F600"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, _ := json.Marshal(s)
		got := appendStringClassic(nil, s)
		if !bytes.Equal(got, want) {
			t.Fatalf("appendStringClassic(%q) = %s, encoding/json %s", s, got, want)
		}
		var ws string
		if err := json.Unmarshal(want, &ws); err != nil {
			t.Fatal(err)
		}
		for _, text := range [][]byte{want, appendStringNewArch(nil, s)} {
			sc := jsonscan.Scanner{Data: text}
			b, err := sc.Str()
			if err != nil || string(b) != ws {
				t.Fatalf("scanner read %s as %q, %v; want %q", text, b, err, ws)
			}
		}
	})
}

// FuzzParseFloat checks parseFloat (with its own path for results below the smallest
// normal number) against strconv.ParseFloat, as float64 and as float32, on numbers
// built around that range.
func FuzzParseFloat(f *testing.F) {
	for _, s := range []string{"5e-324", "4.9406564584124654e-324", "2.4703282292062328e-324", "2.4703282292062327e-324",
		"2.2250738585072011e-308", "2.225073858507201e-308", "1e-45", "1.4e-45", "7.006492e-46", "7.00649232e-46",
		"1.1754942e-38", "-0.000001e-320", "123456789012345678901234567890e-340", "1e-400", "-1e-400", "0e-400", "1.5", "0.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sc := jsonscan.Scanner{Data: []byte(s)}
		raw, err := sc.Number()
		if err != nil || sc.Pos != len(s) || len(raw) != len(s) { // (Number skips leading white space)
			return // not a JSON number
		}
		for _, bits := range []int{64, 32} {
			want, werr := strconv.ParseFloat(s, bits)
			got, gerr := parseFloat(raw, bits)
			if (werr == nil) != (gerr == nil) || math.Float64bits(got) != math.Float64bits(want) {
				t.Fatalf("parseFloat(%q, %d) = %v (%x), %v; strconv %v (%x), %v", s, bits, got, math.Float64bits(got), gerr, want, math.Float64bits(want), werr)
			}
		}
	})
}

package open

import (
	"reflect"
	"testing"

	"github.com/tidb-parity/parity/cdc/open/internal/reference"
)

// FuzzDecodeReference checks the decoder against internal/reference, the decoder as it
// was before its allocations and scanner were reworked (a frozen copy): on any record,
// both return the same events, or errors with the same text (offsets, event index,
// field).
func FuzzDecodeReference(f *testing.F) {
	for _, c := range loadCorpus(f) {
		mode := uint8(0)
		for i, comp := range fuzzCompressions {
			if comp == Compression(c.Encoder.Compression) {
				mode = uint8(i)
			}
		}
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
		ref, err := reference.NewDecoder(reference.DecoderConfig{Compression: reference.Compression(comp), KeepClaimCheck: true, MaxPayloadBytes: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		checkAgainstReference(t, d, ref, key, value)
	})
}

func checkAgainstReference(t *testing.T, d *Decoder, ref *reference.Decoder, key, value []byte) {
	t.Helper()
	got, err := d.Decode(key, value)
	want, werr := ref.Decode(key, value)
	if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
		t.Fatalf("error %v\nreference %v", err, werr)
	}
	if err != nil {
		return
	}
	if len(got) != len(want) {
		t.Fatalf("%d events, reference %d", len(got), len(want))
	}
	for i := range want {
		w := fromReference(&want[i])
		if !reflect.DeepEqual(got[i], w) {
			t.Fatalf("event %d:\n got %#v\nwant %#v", i, got[i], w)
		}
	}
}

func fromReference(ev *reference.Event) Event {
	cols := func(in []reference.Column) []Column {
		if in == nil {
			return nil
		}
		out := make([]Column, len(in))
		for i, c := range in {
			out[i] = Column{Name: c.Name, Type: c.Type, Flags: Flag(c.Flags), Value: c.Value}
		}
		return out
	}
	return Event{
		Kind: Kind(ev.Kind), CommitTs: ev.CommitTs, Schema: ev.Schema, Table: ev.Table,
		Partition: ev.Partition, RowID: ev.RowID, Op: Op(ev.Op),
		Columns: cols(ev.Columns), OldColumns: cols(ev.OldColumns),
		OnlyHandleKey: ev.OnlyHandleKey, ClaimCheckLocation: ev.ClaimCheckLocation,
		Query: ev.Query, DDLType: ev.DDLType, Malformed: ev.Malformed,
	}
}

// TestCorpusReference decodes every corpus record (claim-check objects loaded) with both
// decoders.
func TestCorpusReference(t *testing.T) {
	for _, c := range loadCorpus(t) {
		t.Run(c.Name, func(t *testing.T) {
			ref, err := reference.NewDecoder(reference.DecoderConfig{
				Compression: reference.Compression(c.Encoder.Compression), ClaimCheck: c.claimCheckLoader(),
			})
			if err != nil {
				t.Fatal(err)
			}
			d := c.decoder(t, false)
			for _, m := range c.Messages {
				checkAgainstReference(t, d, ref, c.read(t, m.KeyFile), c.read(t, m.ValueFile))
			}
		})
	}
}

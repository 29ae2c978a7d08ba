package open

import (
	"errors"
	"strings"
	"testing"
)

func batchRow(id int64, v string) *Event {
	return &Event{Kind: KindRow, CommitTs: uint64(100 + id), Schema: "s", Table: "t", RowID: id, Op: OpInsert,
		Columns: []Column{
			{Name: "v", Type: TypeVarchar, Flags: FlagNullable, Value: v},
			{Name: "id", Type: TypeLong, Flags: FlagBinary | FlagHandleKey | FlagPrimaryKey, Value: id},
		}}
}

// TestEncoderBatchesByBytes follows tiflow's rule: a new record starts when the last
// record's Length() + key + value + 16 would exceed max-message-bytes.
func TestEncoderBatchesByBytes(t *testing.T) {
	probe, _ := NewEncoder(DefaultEncoderConfig())
	key, value, err := probe.encodeRow(batchRow(1, "xxxxxxxxxx"), false, "")
	if err != nil {
		t.Fatal(err)
	}
	per := len(key) + len(value) + 16
	// Room for exactly three events per record: version 8 + overhead 36 + 3*per.
	max := 8 + MaxRecordOverhead + 3*per
	enc, err := NewEncoder(EncoderConfig{MaxMessageBytes: max})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		if err := enc.AppendRow(batchRow(int64(i%9+1), "xxxxxxxxxx")); err != nil {
			t.Fatal(err)
		}
	}
	msgs := enc.Build()
	var sizes []int
	for _, m := range msgs {
		sizes = append(sizes, m.Events)
		if m.Length() > max {
			t.Errorf("record of %d bytes exceeds max-message-bytes %d", m.Length(), max)
		}
	}
	if len(sizes) != 3 || sizes[0] != 3 || sizes[1] != 3 || sizes[2] != 1 {
		t.Errorf("records hold %v events, want [3 3 1]", sizes)
	}
	if again := enc.Build(); again != nil {
		t.Errorf("Build did not reset: %d records", len(again))
	}
	// Every record decodes back to its events.
	d, _ := NewDecoder(DefaultDecoderConfig())
	n := 0
	for _, m := range msgs {
		evs, err := d.Decode(m.Key, m.Value)
		if err != nil {
			t.Fatal(err)
		}
		n += len(evs)
	}
	if n != 7 {
		t.Errorf("decoded %d events, want 7", n)
	}
}

func TestEncoderLargeMessages(t *testing.T) {
	big := batchRow(1, strings.Repeat("x", 2000))
	enc, _ := NewEncoder(EncoderConfig{MaxMessageBytes: 1024})
	if err := enc.AppendRow(big); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("no large-message handling: %v, want ErrMessageTooLarge", err)
	}

	enc, _ = NewEncoder(EncoderConfig{MaxMessageBytes: 1024, LargeMessageHandle: LargeMessageHandleKeyOnly})
	if err := enc.AppendRow(big); err != nil {
		t.Fatal(err)
	}
	m := enc.Build()[0]
	d, _ := NewDecoder(DefaultDecoderConfig())
	evs, err := d.Decode(m.Key, m.Value)
	if err != nil {
		t.Fatal(err)
	}
	if !evs[0].OnlyHandleKey || len(evs[0].Columns) != 1 || evs[0].Columns[0].Name != "id" {
		t.Errorf("handle-key-only event: %+v", evs[0])
	}
	noKey := batchRow(2, strings.Repeat("x", 2000))
	noKey.Columns[1].Flags &^= FlagHandleKey
	noKey.Columns = append(noKey.Columns, Column{Name: "pad", Type: TypeVarchar, Value: strings.Repeat("y", 2000), Flags: FlagHandleKey})
	if err := enc.AppendRow(noKey); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("handle key itself too large: %v, want ErrMessageTooLarge", err)
	}

	objects := map[string][]byte{}
	enc, err = NewEncoder(EncoderConfig{MaxMessageBytes: 1024, LargeMessageHandle: LargeMessageClaimCheck,
		ClaimCheckStorageURI: "file:///cc/", ClaimCheckWrite: func(name string, data []byte) error { objects[name] = data; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.AppendRow(big); err != nil {
		t.Fatal(err)
	}
	m = enc.Build()[0]
	if len(objects) != 1 {
		t.Fatalf("%d claim-check objects", len(objects))
	}
	var name string
	for n := range objects {
		name = n
	}
	if len(name) != 41 || !strings.HasSuffix(name, ".json") || name[14] != '4' {
		t.Errorf("object name %q is not <uuid v4>.json", name)
	}
	d, _ = NewDecoder(DecoderConfig{ClaimCheck: func(loc string) ([]byte, error) {
		if loc != "file:///cc/"+name {
			t.Errorf("location %q", loc)
		}
		return objects[ClaimCheckFileName(loc)], nil
	}})
	evs, err = d.Decode(m.Key, m.Value)
	if err != nil {
		t.Fatal(err)
	}
	if evs[0].OnlyHandleKey || evs[0].ClaimCheckLocation != "file:///cc/"+name || evs[0].Columns[0].Value != big.Columns[1].Value ||
		evs[0].Columns[1].Value != big.Columns[0].Value {
		t.Errorf("claim-check event: %+v", evs[0])
	}
}

func TestEncoderConfigValidate(t *testing.T) {
	err := EncoderConfig{MaxBatchSize: -1, MaxMessageBytes: -2, Compression: "zstd", Flavour: "x",
		LargeMessageHandle: LargeMessageClaimCheck}.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, w := range []string{"max-batch-size", "max-message-bytes", "compression", "flavour", "claim-check-storage-uri", "claim-check-write"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not report %s", err, w)
		}
	}
	if err := DefaultEncoderConfig().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	if _, err := NewEncoder(EncoderConfig{Compression: "zstd"}); err == nil {
		t.Error("NewEncoder accepted a bad config")
	}
	err = DecoderConfig{Compression: "gzip", MaxPayloadBytes: -1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "compression") || !strings.Contains(err.Error(), "max-payload-bytes") {
		t.Errorf("decoder config: %v", err)
	}
	if err := DefaultDecoderConfig().Validate(); err != nil {
		t.Errorf("decoder defaults: %v", err)
	}
}

func TestEncoderRejects(t *testing.T) {
	enc, _ := NewEncoder(DefaultEncoderConfig())
	for name, ev := range map[string]*Event{
		"ddl as row":   {Kind: KindDDL},
		"no op":        {Kind: KindRow},
		"unknown type": {Kind: KindRow, Op: OpInsert, Columns: []Column{{Name: "g", Type: TypeGeometry, Value: "x"}}},
		"int as text":  {Kind: KindRow, Op: OpInsert, Columns: []Column{{Name: "i", Type: TypeLong, Value: "1"}}},
		"NaN":          {Kind: KindRow, Op: OpInsert, Columns: []Column{{Name: "f", Type: TypeDouble, Value: nan()}}},
		"blob as int":  {Kind: KindRow, Op: OpInsert, Columns: []Column{{Name: "b", Type: TypeBlob, Value: int64(1)}}},
	} {
		if err := enc.AppendRow(ev); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := enc.EncodeDDL(&Event{Kind: KindRow}); err == nil {
		t.Error("EncodeDDL accepted a row")
	}
	if msgs := enc.Build(); len(msgs) != 0 {
		t.Errorf("rejected events were batched: %d records", len(msgs))
	}
}

func nan() float64 {
	var z float64
	return z / z
}

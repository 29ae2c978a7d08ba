package open

import (
	"encoding/binary"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/snappy"
)

// record frames key and value JSON texts the way TiCDC does.
func record(keys []string, values []string) (key, value []byte) {
	key = binary.BigEndian.AppendUint64(nil, BatchVersion)
	for _, k := range keys {
		key = binary.BigEndian.AppendUint64(key, uint64(len(k)))
		key = append(key, k...)
	}
	value = []byte{}
	for _, v := range values {
		value = binary.BigEndian.AppendUint64(value, uint64(len(v)))
		value = append(value, v...)
	}
	return key, value
}

func be(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

const rowKey = `{"ts":1,"scm":"s","tbl":"t","t":1}`

// row returns a one-column insert value.
func row(col string) string { return `{"u":{"a":` + col + `}}` }

func TestDecodeMalformed(t *testing.T) {
	okKey, okVal := record([]string{rowKey}, []string{row(`{"t":3,"f":0,"v":1}`)})
	k2, v1 := record([]string{rowKey, rowKey}, []string{row(`{"t":3,"f":0,"v":1}`)})
	k1, v2 := record([]string{rowKey}, []string{row(`{"t":3,"f":0,"v":1}`), row(`{"t":3,"f":0,"v":1}`)})
	deep := strings.Repeat("[", 100) + strings.Repeat("]", 100)
	type tc struct {
		name        string
		key, value  []byte
		cfg         DecoderConfig
		want        error
		part, field string
		index       int
		offset      int // -1: do not check
	}
	one := func(name, key, value string, want error, part, field string) tc {
		k, v := record([]string{key}, []string{value})
		return tc{name: name, key: k, value: v, want: want, part: part, field: field, offset: -1}
	}
	cases := []tc{
		{name: "empty key", key: nil, value: nil, want: ErrTruncated, part: "key", field: "version", index: -1, offset: 0},
		{name: "short version", key: []byte{0, 0, 1}, value: nil, want: ErrTruncated, part: "key", field: "version", index: -1, offset: 0},
		{name: "bad version", key: cat(be(2), okKey[8:]), value: okVal, want: ErrVersion, part: "key", field: "version", index: -1, offset: 0},
		{name: "version only", key: be(1), value: nil, want: ErrTruncated, part: "key", index: -1, offset: 8},
		{name: "truncated key length", key: cat(be(1), []byte{0, 0, 0}), value: okVal, want: ErrTruncated, part: "key", field: "length", offset: 8},
		{name: "truncated value length", key: okKey, value: []byte{0, 0}, want: ErrTruncated, part: "value", field: "length", offset: 0},
		{name: "key length past end", key: cat(be(1), be(100), []byte(rowKey)), value: okVal, want: ErrLength, part: "key", field: "length", offset: 8},
		{name: "value length past end", key: okKey, value: cat(be(uint64(len(okVal))), okVal[8:]), want: ErrLength, part: "value", field: "length", offset: 0},
		{name: "100 MB length claim", key: okKey, value: cat(be(100<<20), []byte(`{"u":{}}`)), want: ErrLength, part: "value", field: "length", offset: 0},
		{name: "max uint64 length", key: cat(be(1), be(1<<64-1), []byte("{}")), value: okVal, want: ErrLength, part: "key", field: "length", offset: 8},
		{name: "two keys one value", key: k2, value: v1, want: ErrCountMismatch, part: "value", index: 1, offset: 0},
		{name: "one key two values", key: k1, value: v2, want: ErrCountMismatch, part: "value", index: 1, offset: 0},
		{name: "bad key JSON", key: cat(be(1), be(12), []byte(`{"ts":1,"t":`)), value: okVal[:8+len(row(`{"t":3,"f":0,"v":1}`))], want: ErrSyntax, part: "key", offset: 8 + 8 + 12},
		one("bad value JSON", rowKey, `{"u":{"a":{"t":3,"f":0,"v":1}}`, ErrSyntax, "value", ""),
		one("trailing garbage", rowKey, row(`{"t":3,"f":0,"v":1}`)+"x", ErrSyntax, "value", ""),
		one("trailing comma", rowKey, `{"u":{"a":{"t":3,"f":0,"v":1},}}`, ErrSyntax, "value", "u"),
		one("control char in string", rowKey, row("{\"t\":15,\"f\":0,\"v\":\"a\x01\"}"), ErrSyntax, "value", "u.a.v"),
		one("bad escape", rowKey, row(`{"t":15,"f":0,"v":"\q"}`), ErrSyntax, "value", "u.a.v"),
		one("bad number", rowKey, row(`{"t":3,"f":0,"v":01}`), ErrSyntax, "value", "u.a"),
		one("missing ts", `{"t":1}`, row(`{"t":3,"f":0,"v":1}`), ErrMissingField, "key", "ts"),
		one("missing t", `{"ts":1}`, row(`{"t":3,"f":0,"v":1}`), ErrMissingField, "key", "t"),
		one("unknown event type", `{"ts":1,"t":4}`, row(`{"t":3,"f":0,"v":1}`), ErrKind, "key", "t"),
		one("ts beyond uint64", `{"ts":18446744073709551616,"t":1}`, row(`{"t":3,"f":0,"v":1}`), ErrRange, "key", "ts"),
		one("ts negative", `{"ts":-1,"t":1}`, row(`{"t":3,"f":0,"v":1}`), ErrRange, "key", "ts"),
		one("ts as string", `{"ts":"1","t":1}`, row(`{"t":3,"f":0,"v":1}`), ErrValue, "key", "ts"),
		one("ohk not bool", `{"ts":1,"t":1,"ohk":1}`, row(`{"t":3,"f":0,"v":1}`), ErrValue, "key", "ohk"),
		one("unknown type code", rowKey, row(`{"t":99,"f":0,"v":1}`), ErrUnknownType, "value", "u.a.t"),
		one("type code beyond a byte", rowKey, row(`{"t":300,"f":0,"v":1}`), ErrUnknownType, "value", "u.a.t"),
		one("geometry", rowKey, row(`{"t":255,"f":0,"v":null}`), ErrUnknownType, "value", "u.a.t"),
		one("missing t in column", rowKey, row(`{"f":0,"v":1}`), ErrMissingField, "value", "u.a.t"),
		one("missing f in column", rowKey, row(`{"t":3,"v":1}`), ErrMissingField, "value", "u.a.f"),
		one("missing v in column", rowKey, row(`{"t":3,"f":0}`), ErrMissingField, "value", "u.a.v"),
		one("invalid base64", rowKey, row(`{"t":252,"f":1,"v":"AP8"}`), ErrBase64, "value", "u.a.v"),
		one("base64 bad char", rowKey, row(`{"t":252,"f":1,"v":"A*8="}`), ErrBase64, "value", "u.a.v"),
		one("base64 with line break", rowKey, row(`{"t":252,"f":1,"v":"AP8=\nAP8="}`), ErrBase64, "value", "u.a.v"),
		one("bad Go quoting", rowKey, row(`{"t":15,"f":1,"v":"\\x4"}`), ErrQuoted, "value", "u.a.v"),
		one("tinyint out of range", rowKey, row(`{"t":1,"f":0,"v":300}`), ErrRange, "value", "u.a.v"),
		one("unsigned tinyint negative", rowKey, row(`{"t":1,"f":128,"v":-1}`), ErrRange, "value", "u.a.v"),
		one("int out of range", rowKey, row(`{"t":3,"f":0,"v":2147483648}`), ErrRange, "value", "u.a.v"),
		one("bigint beyond int64", rowKey, row(`{"t":8,"f":0,"v":9223372036854775808}`), ErrRange, "value", "u.a.v"),
		one("unsigned bigint beyond uint64", rowKey, row(`{"t":8,"f":128,"v":18446744073709551616}`), ErrRange, "value", "u.a.v"),
		one("bit beyond uint64", rowKey, row(`{"t":16,"f":129,"v":99999999999999999999}`), ErrRange, "value", "u.a.v"),
		one("year out of range", rowKey, row(`{"t":13,"f":129,"v":3000}`), ErrRange, "value", "u.a.v"),
		one("float beyond float32", rowKey, row(`{"t":4,"f":1,"v":1e39}`), ErrRange, "value", "u.a.v"),
		one("double beyond float64", rowKey, row(`{"t":5,"f":1,"v":1e309}`), ErrRange, "value", "u.a.v"),
		one("fractional integer", rowKey, row(`{"t":3,"f":0,"v":1.5}`), ErrValue, "value", "u.a.v"),
		one("int as string", rowKey, row(`{"t":3,"f":0,"v":"1"}`), ErrValue, "value", "u.a.v"),
		one("decimal as number", rowKey, row(`{"t":246,"f":1,"v":1.5}`), ErrValue, "value", "u.a.v"),
		one("varchar as bool", rowKey, row(`{"t":15,"f":0,"v":true}`), ErrValue, "value", "u.a.v"),
		one("value as object", rowKey, row(`{"t":15,"f":0,"v":{}}`), ErrValue, "value", "u.a.v"),
		one("flags negative", rowKey, row(`{"t":3,"f":-1,"v":1}`), ErrRange, "value", "u.a.f"),
		one("row without columns", rowKey, `{}`, ErrEmptyRow, "value", "u"),
		one("row with empty u", rowKey, `{"u":{}}`, ErrEmptyRow, "value", "u"),
		one("section not an object", rowKey, `{"u":[1]}`, ErrValue, "value", "u"),
		one("delete with u", rowKey, `{"d":{"a":{"t":3,"f":0,"v":1}},"u":{"a":{"t":3,"f":0,"v":1}}}`, ErrSyntax, "value", "d"),
		one("deep unknown field", rowKey, `{"x":`+deep+`,"u":{"a":{"t":3,"f":0,"v":1}}}`, ErrNesting, "value", "x"),
		one("ddl without query", `{"ts":1,"t":2}`, `{"t":3}`, ErrMissingField, "value", "q"),
		one("ddl query not string", `{"ts":1,"t":2}`, `{"q":1,"t":3}`, ErrValue, "value", "q"),
		one("claim check without loader", `{"ts":1,"scm":"s","tbl":"t","t":1,"ccl":"file:///x/y.json"}`, row(`{"t":3,"f":0,"v":1}`), ErrClaimCheck, "key", "ccl"),
	}
	// A snappy payload whose header claims far more than the limit.
	huge := snappy.Encode(nil, []byte(strings.Repeat("x", 1<<16)))
	hk, hv := record([]string{rowKey}, []string{string(huge)})
	cases = append(cases,
		tc{name: "snappy garbage", key: okKey, value: okVal, cfg: DecoderConfig{Compression: CompressionSnappy}, want: ErrCompression, part: "value", field: "payload", offset: 8},
		tc{name: "lz4 garbage", key: okKey, value: okVal, cfg: DecoderConfig{Compression: CompressionLZ4}, want: ErrCompression, part: "value", field: "payload", offset: 8},
		tc{name: "snappy beyond limit", key: hk, value: hv, cfg: DecoderConfig{Compression: CompressionSnappy, MaxPayloadBytes: 1 << 10}, want: ErrTooLarge, part: "value", field: "payload", offset: 8},
	)
	// An error in the second event names index 1 and its offset.
	bk, bv := record([]string{rowKey, rowKey}, []string{row(`{"t":3,"f":0,"v":1}`), row(`{"t":3,"f":0,"v":"x"}`)})
	second := 8 + len(row(`{"t":3,"f":0,"v":1}`)) + 8
	cases = append(cases, tc{name: "second event", key: bk, value: bv, want: ErrValue, part: "value", field: "u.a.v", index: 1,
		offset: second + strings.Index(row(`{"t":3,"f":0,"v":"x"}`), `"x"`)})

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := NewDecoder(c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			evs, err := d.Decode(c.key, c.value)
			if err == nil {
				t.Fatalf("decoded %d events, want error %v", len(evs), c.want)
			}
			if evs != nil {
				t.Errorf("returned %d events with the error", len(evs))
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("error %q does not wrap %q", err, c.want)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error %T is not a *DecodeError", err)
			}
			if de.Part != c.part {
				t.Errorf("part %q, want %q (%v)", de.Part, c.part, err)
			}
			if c.field != "" && de.Field != c.field {
				t.Errorf("field %q, want %q (%v)", de.Field, c.field, err)
			}
			if c.index != de.Index && !(c.index == 0 && de.Index == 0) {
				t.Errorf("index %d, want %d (%v)", de.Index, c.index, err)
			}
			if c.offset >= 0 && de.Offset != c.offset {
				t.Errorf("offset %d, want %d (%v)", de.Offset, c.offset, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, de.Part+" byte ") || (de.Field != "" && !strings.Contains(msg, "field "+de.Field)) {
				t.Errorf("message %q does not name the part, offset and field", msg)
			}
		})
	}
}

func TestDecodeErrorWithRecord(t *testing.T) {
	d, _ := NewDecoder(DefaultDecoderConfig())
	_, err := d.Decode(be(7), nil)
	err = WithRecord(err, "cdc-topic", 2, 12345)
	var de *DecodeError
	if !errors.As(err, &de) || !de.HasRecord || de.Topic != "cdc-topic" || de.Partition != 2 || de.KafkaOffset != 12345 {
		t.Fatalf("WithRecord did not attach the record: %#v", err)
	}
	want := "decode open-protocol record topic cdc-topic partition 2 offset 12345: key byte 0, field version: unsupported key format version 7"
	if err.Error() != want {
		t.Errorf("message\n got %q\nwant %q", err.Error(), want)
	}
	if !errors.Is(err, ErrVersion) {
		t.Error("errors.Is(ErrVersion) fails")
	}
}

// TestDecodeBoundedMemory checks that a record claiming a 100 MB (or 2^64-1 byte) frame
// is rejected without allocating anything near that size.
func TestDecodeBoundedMemory(t *testing.T) {
	d, _ := NewDecoder(DefaultDecoderConfig())
	key := cat(be(1), be(uint64(len(rowKey))), []byte(rowKey))
	for _, claim := range []uint64{100 << 20, 1<<63 - 1, 1<<64 - 1} {
		value := cat(be(claim), []byte(row(`{"t":3,"f":0,"v":1}`)))
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range 100 {
			if _, err := d.Decode(key, value); !errors.Is(err, ErrLength) {
				t.Fatalf("claim %d: %v", claim, err)
			}
		}
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > 1<<20 {
			t.Errorf("claim %d: 100 decodes allocated %d bytes", claim, n)
		}
	}
}

// TestDecodeDuplicateMembers: the last value of a repeated key member wins, as in
// encoding/json (the new-architecture claim-check key repeats "ohk").
func TestDecodeDuplicateMembers(t *testing.T) {
	d, _ := NewDecoder(DecoderConfig{KeepClaimCheck: true})
	k, v := record([]string{`{"ts":5,"scm":"s","tbl":"t","t":1,"ohk":true,"ohk":false,"ccl":"file:///c/x.json"}`},
		[]string{row(`{"t":3,"h":true,"f":11,"v":1}`)})
	evs, err := d.Decode(k, v)
	if err != nil {
		t.Fatal(err)
	}
	if evs[0].OnlyHandleKey || evs[0].ClaimCheckLocation != "file:///c/x.json" || !evs[0].Columns[0].IsHandle() {
		t.Errorf("got %+v", evs[0])
	}
}

// TestDecodeTruncatedCorpus cuts every corpus record short (every key prefix, and value
// prefixes near the frame boundaries and spread over the payload) and flips bytes: the
// decoder must return a *DecodeError, never a panic or a partial batch.
func TestDecodeTruncatedCorpus(t *testing.T) {
	for _, c := range loadCorpus(t) {
		d := c.decoder(t, true)
		for _, m := range c.Messages {
			key, value := c.read(t, m.KeyFile), c.read(t, m.ValueFile)
			check := func(k, v []byte, what string) {
				t.Helper()
				evs, err := d.Decode(k, v)
				if err == nil {
					return // a cut on a frame boundary can still be a valid record
				}
				var de *DecodeError
				if !errors.As(err, &de) || evs != nil {
					t.Fatalf("%s %s: %T %v with %d events", c.Name, what, err, err, len(evs))
				}
			}
			for i := range len(key) {
				check(key[:i], value, "key prefix")
			}
			step := max(1, len(value)/64)
			for i := 0; i < len(value); i += step {
				check(key, value[:i], "value prefix")
			}
			for i := max(0, len(value)-16); i < len(value); i++ {
				check(key, value[:i], "value prefix")
			}
			flipped := append([]byte(nil), value...)
			for i := 0; i < len(flipped); i += step {
				flipped[i] ^= 0x5a
				check(key, flipped, "flipped value")
				flipped[i] ^= 0x5a
			}
		}
	}
}

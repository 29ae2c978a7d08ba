package canal

import (
	"errors"
	"strings"
	"testing"
)

// TestMalformed: records parity cannot apply are errors that say why and where.
func TestMalformed(t *testing.T) {
	const row = `{"database":"d","table":"t","pkNames":["id"],"isDdl":false,"type":"INSERT","mysqlType":{"id":"int","b":"blob"},"data":[{"id":"1","b":%s}],"old":null,"_tidb":{"commitTs":5}}`
	for _, tc := range []struct {
		name, value string
		err         error
		field, msg  string
	}{
		{"no TiDB extension (a watermark cannot exist)", `{"database":"d","table":"t","pkNames":["id"],"isDdl":false,"type":"INSERT","mysqlType":{"id":"int"},"data":[{"id":"1"}],"old":null}`,
			ErrNoExtension, "_tidb", "enable-tidb-extension=true"},
		{"no commit ts", `{"table":"t","type":"INSERT","mysqlType":{"id":"int"},"data":[{"id":"1"}],"_tidb":{}}`, ErrMissingField, "_tidb.commitTs", ""},
		{"watermark without ts", `{"type":"TIDB_WATERMARK","_tidb":{}}`, ErrMissingField, "_tidb.watermarkTs", ""},
		{"not JSON", `{"type":`, ErrSyntax, "", ""},
		{"unknown type", `{"table":"t","type":"UPSERT","mysqlType":{"id":"int"},"data":[{"id":"1"}],"_tidb":{"commitTs":5}}`, ErrKind, "type", "UPSERT"},
		{"DDL without statement", `{"isDdl":true,"type":"CREATE","sql":"","_tidb":{"commitTs":5}}`, ErrMissingField, "sql", ""},
		{"binary not ISO-8859-1", strings.Replace(row, "%s", `"a\u0100"`, 1), ErrValue, "data[0].b", "U+0100"},
		{"number where a string belongs", strings.Replace(row, "%s", `12`, 1), ErrValue, "data[0].b", ""},
		{"int out of range", `{"table":"t","type":"INSERT","mysqlType":{"id":"int"},"data":[{"id":"2147483648"}],"_tidb":{"commitTs":5}}`, ErrValue, "data[0].id", "out of range"},
		{"column without mysqlType", `{"table":"t","type":"INSERT","mysqlType":{"id":"int"},"data":[{"id":"1","x":"2"}],"_tidb":{"commitTs":5}}`, ErrMissingField, "data[0].x", ""},
		{"unknown mysqlType", `{"table":"t","type":"INSERT","mysqlType":{"id":"vector"},"data":[{"id":"[1]"}],"_tidb":{"commitTs":5}}`, ErrUnknownType, "mysqlType.id", "vector"},
		{"update without old", `{"table":"t","type":"UPDATE","mysqlType":{"id":"int"},"data":[{"id":"1"}],"old":null,"_tidb":{"commitTs":5}}`, ErrMissingField, "old", ""},
		{"primary key missing from the row", `{"table":"t","type":"DELETE","pkNames":["id"],"mysqlType":{"id":"int","v":"int"},"data":[{"v":"1"}],"_tidb":{"commitTs":5}}`, ErrMissingField, "data[0].id", ""},
		{"column twice", `{"table":"t","type":"INSERT","mysqlType":{"id":"int"},"data":[{"id":"1","id":"2"}],"_tidb":{"commitTs":5}}`, ErrValue, "data[0].id", "twice"},
	} {
		d, _ := NewDecoder(DecoderConfig{})
		evs, err := d.Decode(nil, []byte(tc.value))
		var de *DecodeError
		if err == nil || evs != nil || !errors.As(err, &de) || !errors.Is(err, tc.err) {
			t.Errorf("%s: %d events, error %v, want %v", tc.name, len(evs), err, tc.err)
			continue
		}
		if de.Field != tc.field || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %q (field %q), want field %q and %q", tc.name, err, de.Field, tc.field, tc.msg)
		}
	}
	d, _ := NewDecoder(DecoderConfig{MaxMessageBytes: 10})
	if _, err := d.Decode(nil, []byte(`{"type":"TIDB_WATERMARK","_tidb":{"watermarkTs":1}}`)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: %v", err)
	}
}

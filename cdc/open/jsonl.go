package open

import (
	"encoding/base64"
	"strconv"
)

// RecordRef says where a decoded event came from, for AppendJSONLine.
type RecordRef struct {
	Topic     string
	Partition int
	Offset    int64
	Index     int // event index inside the record
}

// AppendJSONLine appends ev as one line of JSON (with the trailing newline): the stable
// format `parity decode` prints, documented in docs/decode.md.
//
//	{"kind":"row","commit_ts":464627522701885447,"schema":"s","table":"t","op":"update",
//	 "columns":[{"name":"id","type":8,"flags":11,"handle":true,"value":1},…],
//	 "old_columns":[…]}
//	{"kind":"ddl","commit_ts":…,"schema":"s","table":"t","query":"…","ddl_type":3}
//	{"kind":"resolved","commit_ts":…}
//
// Values: null for NULL; exact integers (uint64 included) for integer types, YEAR, BIT,
// ENUM index and SET bitmask; JSON numbers for FLOAT/DOUBLE (FLOAT in its shortest
// float32 form); strings for DECIMAL, temporal types, JSON and VECTOR; UTF-8 strings for
// character columns; standard base64 for binary columns ([]byte values). Strings are
// escaped like encoding/json without HTML escaping; invalid UTF-8 becomes U+FFFD.
// Optional members are left out when empty: partition_id, row_id, only_handle_key,
// claim_check_location, old_columns, malformed, and the kafka_* members (rec == nil).
func AppendJSONLine(b []byte, ev *Event, rec *RecordRef) []byte {
	b = append(b, `{"kind":`...)
	b = appendJSONString(b, ev.Kind.String())
	b = append(b, `,"commit_ts":`...)
	b = strconv.AppendUint(b, ev.CommitTs, 10)
	if ev.Kind != KindResolved {
		b = append(b, `,"schema":`...)
		b = appendJSONString(b, ev.Schema)
		b = append(b, `,"table":`...)
		b = appendJSONString(b, ev.Table)
		if ev.Partition != 0 {
			b = append(b, `,"partition_id":`...)
			b = strconv.AppendInt(b, ev.Partition, 10)
		}
		if ev.RowID != 0 {
			b = append(b, `,"row_id":`...)
			b = strconv.AppendInt(b, ev.RowID, 10)
		}
	}
	switch ev.Kind {
	case KindRow:
		b = append(b, `,"op":`...)
		b = appendJSONString(b, ev.Op.String())
		if ev.OnlyHandleKey {
			b = append(b, `,"only_handle_key":true`...)
		}
		if ev.ClaimCheckLocation != "" {
			b = append(b, `,"claim_check_location":`...)
			b = appendJSONString(b, ev.ClaimCheckLocation)
		}
		b = append(b, `,"columns":`...)
		b = appendJSONColumns(b, ev.Columns)
		if ev.OldColumns != nil {
			b = append(b, `,"old_columns":`...)
			b = appendJSONColumns(b, ev.OldColumns)
		}
		if len(ev.Malformed) > 0 {
			b = append(b, `,"malformed":[`...)
			for i, m := range ev.Malformed {
				if i > 0 {
					b = append(b, ',')
				}
				b = appendJSONString(b, m)
			}
			b = append(b, ']')
		}
	case KindDDL:
		b = append(b, `,"query":`...)
		b = appendJSONString(b, ev.Query)
		b = append(b, `,"ddl_type":`...)
		b = strconv.AppendInt(b, int64(ev.DDLType), 10)
	}
	if rec != nil {
		b = append(b, `,"kafka_topic":`...)
		b = appendJSONString(b, rec.Topic)
		b = append(b, `,"kafka_partition":`...)
		b = strconv.AppendInt(b, int64(rec.Partition), 10)
		b = append(b, `,"kafka_offset":`...)
		b = strconv.AppendInt(b, rec.Offset, 10)
		b = append(b, `,"event_index":`...)
		b = strconv.AppendInt(b, int64(rec.Index), 10)
	}
	return append(b, "}\n"...)
}

func appendJSONColumns(b []byte, cols []Column) []byte {
	b = append(b, '[')
	for i := range cols {
		c := &cols[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = appendJSONString(b, c.Name)
		b = append(b, `,"type":`...)
		b = strconv.AppendUint(b, uint64(c.Type), 10)
		b = append(b, `,"flags":`...)
		b = strconv.AppendUint(b, uint64(c.Flags), 10)
		b = append(b, `,"handle":`...)
		b = strconv.AppendBool(b, c.IsHandle())
		b = append(b, `,"value":`...)
		b = appendJSONValue(b, c)
		b = append(b, '}')
	}
	return append(b, ']')
}

func appendJSONValue(b []byte, c *Column) []byte {
	switch v := c.Value.(type) {
	case nil:
		return append(b, "null"...)
	case int64:
		return strconv.AppendInt(b, v, 10)
	case uint64:
		return strconv.AppendUint(b, v, 10)
	case float64:
		bits := 64
		if c.Type == TypeFloat {
			bits = 32
		}
		out, err := appendFloat(b, v, bits)
		if err != nil {
			return append(b, "null"...) // not produced by the decoder: JSON has no NaN/Inf
		}
		return out
	case string:
		return appendJSONString(b, v)
	case []byte:
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, v)
		return append(b, '"')
	}
	// Values of other Go types (not produced by the decoder) go through the encoder's
	// rendering so the line stays valid JSON.
	var e Encoder
	if out, err := e.appendValue(b, c); err == nil {
		return out
	}
	return append(b, "null"...)
}

// appendJSONString writes s like encoding/json with SetEscapeHTML(false).
func appendJSONString(b []byte, s string) []byte { return appendStringJSON(b, s, false) }

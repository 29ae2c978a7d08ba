package loadgen

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/tidb-parity/parity/cdc/open"
)

// canal-json as TiCDC v8.5 writes it with enable-tidb-extension=true (tiflow
// pkg/sink/codec/canal: canal_json_row_event_encoder.go newJSONMessageForDML for rows,
// JSONMessage for DDLs and TIDB_WATERMARK): one message per row, an empty key, values as
// strings (binary as ISO-8859-1 text), sqlType (java.sql.Types) and mysqlType per
// column, pkNames, and _tidb.commitTs. DDLs go to partition 0 only.

// canalMessage is TiCDC's JSONMessage with its TiDB extension, for DDLs and watermarks
// (TiCDC marshals it with goccy/go-json, which escapes as encoding/json does).
type canalMessage struct {
	ID        int64             `json:"id"`
	Schema    string            `json:"database"`
	Table     string            `json:"table"`
	PKNames   []string          `json:"pkNames"`
	IsDDL     bool              `json:"isDdl"`
	EventType string            `json:"type"`
	ES        int64             `json:"es"`
	TS        int64             `json:"ts"`
	Query     string            `json:"sql"`
	SQLType   map[string]int32  `json:"sqlType"`
	MySQLType map[string]string `json:"mysqlType"`
	Data      []map[string]any  `json:"data"`
	Old       []map[string]any  `json:"old"`
	TiDB      canalExtension    `json:"_tidb"`
}

type canalExtension struct {
	CommitTs    uint64 `json:"commitTs,omitempty"`
	WatermarkTs uint64 `json:"watermarkTs,omitempty"`
}

// canalTs is TiCDC's convertToCanalTs: the physical milliseconds of a TSO.
func canalTs(ts uint64) int64 { return int64(ts >> 18) }

// canalDDLType is TiCDC's convertDdlEventType for the DDLs loadgen sends.
func canalDDLType(ddlType int) string {
	switch ddlType {
	case ddlCreateTable:
		return "CREATE"
	}
	return "QUERY" // CREATE DATABASE, and TiCDC's default
}

func encodeCanalDDL(ev *open.Event) ([]byte, error) {
	return json.Marshal(canalMessage{Schema: ev.Schema, Table: ev.Table, IsDDL: true, EventType: canalDDLType(ev.DDLType),
		ES: canalTs(ev.CommitTs), TS: time.Now().UnixMilli(), Query: ev.Query, TiDB: canalExtension{CommitTs: ev.CommitTs}})
}

func encodeCanalWatermark(ts uint64) []byte {
	b, _ := json.Marshal(canalMessage{EventType: "TIDB_WATERMARK", ES: canalTs(ts), TS: time.Now().UnixMilli(),
		TiDB: canalExtension{WatermarkTs: ts}}) // cannot fail: no maps or interfaces set
	return b
}

// encodeCanalRow writes one row event as newJSONMessageForDML does, field by field.
func encodeCanalRow(ev *open.Event, t *wireTable) ([]byte, error) {
	if len(ev.Columns) == 0 {
		return nil, fmt.Errorf("%s.%s row without columns", ev.Schema, ev.Table)
	}
	b := make([]byte, 0, 256+64*len(ev.Columns))
	b = append(b, `{"id":0,"database":`...)
	b = appendCanalString(b, ev.Schema)
	b = append(b, `,"table":`...)
	b = appendCanalString(b, ev.Table)
	// pkNames: the primary-key columns of the row, in its order (RowChangedEvent.PrimaryKeyColumnNames).
	b = append(b, `,"pkNames":[`...)
	first := true
	for _, c := range ev.Columns {
		if c.Flags&open.FlagPrimaryKey != 0 {
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendCanalString(b, c.Name)
		}
	}
	typ := "INSERT"
	switch ev.Op {
	case open.OpUpdate:
		typ = "UPDATE"
	case open.OpDelete:
		typ = "DELETE"
	}
	b = append(b, `],"isDdl":false,"type":`...)
	b = appendCanalString(b, typ)
	b = append(b, `,"es":`...)
	b = strconv.AppendInt(b, canalTs(ev.CommitTs), 10)
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, time.Now().UnixMilli(), 10)
	b = append(b, `,"sql":"","sqlType":{`...)
	for i, c := range ev.Columns {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendCanalString(b, c.Name)
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(javaSQLType(&c)), 10)
	}
	b = append(b, `},"mysqlType":{`...)
	for i, c := range ev.Columns {
		j := t.col(c.Name)
		if j < 0 {
			return nil, fmt.Errorf("%s.%s column %s is not in the table's definition", ev.Schema, ev.Table, c.Name)
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = appendCanalString(b, c.Name)
		b = append(b, ':')
		b = appendCanalString(b, t.cols[j].mysqlType())
	}
	b = append(b, '}')
	if ev.Op == open.OpUpdate {
		if len(ev.OldColumns) == 0 {
			return nil, fmt.Errorf("%s.%s update without its old row", ev.Schema, ev.Table)
		}
		b = append(b, `,"old":`...)
		b = appendCanalRow(b, ev.OldColumns)
	} else {
		b = append(b, `,"old":null`...)
	}
	b = append(b, `,"data":`...)
	b = appendCanalRow(b, ev.Columns)
	b = append(b, `,"_tidb":{"commitTs":`...)
	b = strconv.AppendUint(b, ev.CommitTs, 10)
	return append(b, "}}"...), nil
}

// appendCanalRow writes [{"name":"value"|null,...}] (fillColumns).
func appendCanalRow(b []byte, cols []open.Column) []byte {
	b = append(b, "[{"...)
	for i, c := range cols {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendCanalString(b, c.Name)
		b = append(b, ':')
		if c.Value == nil {
			b = append(b, "null"...)
			continue
		}
		b = appendCanalString(b, canalValue(&c))
	}
	return append(b, "}]"...)
}

// canalValue renders a value as canalEntryBuilder.formatValue does: integers in decimal
// (ENUM index, SET bitmask and BIT bits too), FLOAT with float32 precision, binary bytes
// as ISO-8859-1 (every byte the code point of one character), text as it is: what
// ColumnValueString gives but for binary bytes.
func canalValue(c *open.Column) string {
	if v, ok := c.Value.([]byte); ok && c.Flags&open.FlagBinary != 0 {
		r := make([]byte, 0, len(v)+len(v)/2)
		for _, x := range v {
			r = utf8.AppendRune(r, rune(x))
		}
		return string(r)
	}
	return ColumnValueString(*c) // the same text as the open protocol's key hash
}

// java.sql.Types codes TiCDC writes in sqlType (tiflow pkg/sink/codec/internal/java.go).
const (
	javaBit      = -7
	javaTinyint  = -6
	javaSmallint = 5
	javaInteger  = 4
	javaBigint   = -5
	javaReal     = 7
	javaDouble   = 8
	javaDecimal  = 3
	javaChar     = 1
	javaVarchar  = 12
	javaDate     = 91
	javaTime     = 92
	javaTimstamp = 93
	javaBlob     = 2004
	javaClob     = 2005
)

// javaSQLType is tiflow's getJavaSQLType: MySQLType2JavaType of the type code and binary
// flag, an unsigned integer promoted to the next type when its value does not fit the
// signed one (MEDIUMINT never is).
func javaSQLType(c *open.Column) int32 {
	binary := c.Flags&open.FlagBinary != 0
	var j int32
	switch c.Type {
	case open.TypeTiny:
		j = javaTinyint
	case open.TypeShort:
		j = javaSmallint
	case open.TypeLong, open.TypeInt24, open.TypeEnum:
		j = javaInteger
	case open.TypeLonglong:
		j = javaBigint
	case open.TypeFloat:
		j = javaReal
	case open.TypeDouble:
		j = javaDouble
	case open.TypeNewDecimal:
		j = javaDecimal
	case open.TypeTimestamp, open.TypeDatetime:
		j = javaTimstamp
	case open.TypeDate:
		j = javaDate
	case open.TypeDuration:
		j = javaTime
	case open.TypeSet, open.TypeBit:
		j = javaBit
	case open.TypeTinyBlob, open.TypeMediumBlob, open.TypeLongBlob, open.TypeBlob:
		j = javaClob
		if binary {
			j = javaBlob
		}
	case open.TypeVarchar:
		j = javaVarchar
		if binary {
			j = javaBlob
		}
	case open.TypeString:
		j = javaChar
		if binary {
			j = javaBlob
		}
	default: // YEAR, JSON, VECTOR and anything else
		j = javaVarchar
	}
	if c.Flags&open.FlagUnsigned == 0 {
		return j
	}
	v, ok := c.Value.(uint64)
	if !ok {
		return j
	}
	switch {
	case c.Type == open.TypeTiny && v > 127:
		return javaSmallint
	case c.Type == open.TypeShort && v > 32767:
		return javaInteger
	case c.Type == open.TypeLong && v > 2147483647:
		return javaBigint
	case c.Type == open.TypeLonglong && v > 9223372036854775807:
		return javaDecimal
	}
	return j
}

// appendCanalString writes s as a JSON string the way TiCDC's writer does (easyjson
// jwriter.String): ", \ and control characters escaped (\t, \r, \n, else \u00XX), <, >
// and & as \u003c, \u003e, \u0026, invalid UTF-8 bytes as \ufffd, U+2028 and U+2029
// escaped; everything else as it is.
func appendCanalString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	p := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[p:i]...)
			switch c {
			case '\t':
				b = append(b, `\t`...)
			case '\r':
				b = append(b, `\r`...)
			case '\n':
				b = append(b, `\n`...)
			case '\\':
				b = append(b, `\\`...)
			case '"':
				b = append(b, `\"`...)
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			p = i
			continue
		}
		r, w := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && w == 1 {
			b = append(b, s[p:i]...)
			b = append(b, `\ufffd`...)
			i++
			p = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[p:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += w
			p = i
			continue
		}
		i += w
	}
	b = append(b, s[p:]...)
	return append(b, '"')
}

package loadgen

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
)

// simple (JSON) as TiCDC v8.5 writes it with integrity-check-level = "correctness"
// (tiflow pkg/sink/codec/simple/message.go, marshalled with encoding/json): one message
// per row with the table's schemaVersion and TiCDC's row checksums, the types only in the
// tableSchema of DDL and BOOTSTRAP messages, DDLs and WATERMARKs to every partition.

type simpleMessage struct {
	Version        int                `json:"version"`
	Schema         string             `json:"database,omitempty"`
	Table          string             `json:"table,omitempty"`
	TableID        int64              `json:"tableID,omitempty"`
	Type           string             `json:"type"`
	SQL            string             `json:"sql,omitempty"`
	CommitTs       uint64             `json:"commitTs"`
	BuildTs        int64              `json:"buildTs"`
	SchemaVersion  uint64             `json:"schemaVersion,omitempty"`
	Checksum       *simpleChecksum    `json:"checksum,omitempty"`
	Data           map[string]any     `json:"data,omitempty"`
	Old            map[string]any     `json:"old,omitempty"`
	TableSchema    *simpleTableSchema `json:"tableSchema,omitempty"`
	PreTableSchema *simpleTableSchema `json:"preTableSchema,omitempty"`
}

type simpleChecksum struct {
	Version   int    `json:"version"`
	Corrupted bool   `json:"corrupted"`
	Current   uint32 `json:"current"`
	Previous  uint32 `json:"previous"`
}

type simpleTableSchema struct {
	Schema  string               `json:"schema"`
	Table   string               `json:"table"`
	TableID int64                `json:"tableID"`
	Version uint64               `json:"version"`
	Columns []simpleColumnSchema `json:"columns"`
	Indexes []simpleIndexSchema  `json:"indexes"`
}

type simpleColumnSchema struct {
	Name     string         `json:"name"`
	DataType simpleDataType `json:"dataType"`
	Nullable bool           `json:"nullable"`
	Default  any            `json:"default"`
}

type simpleDataType struct {
	MySQLType string   `json:"mysqlType"`
	Charset   string   `json:"charset"`
	Collate   string   `json:"collate"`
	Length    int64    `json:"length,omitempty"`
	Decimal   int      `json:"decimal,omitempty"`
	Elements  []string `json:"elements,omitempty"`
	Unsigned  bool     `json:"unsigned,omitempty"`
	Zerofill  bool     `json:"zerofill,omitempty"`
}

type simpleIndexSchema struct {
	Name     string   `json:"name"`
	Unique   bool     `json:"unique"`
	Primary  bool     `json:"primary"`
	Nullable bool     `json:"nullable"`
	Columns  []string `json:"columns"`
}

// simpleVersion is the message version TiCDC writes.
const simpleVersion = 1

// checksumVersion is the row checksum version TiCDC v8.5 writes.
const checksumVersion = 2

// tableSchema is newTableSchema of the table.
func (t *wireTable) tableSchema() *simpleTableSchema {
	s := &simpleTableSchema{Schema: t.schema, Table: t.name, TableID: t.id, Version: t.version,
		Columns: make([]simpleColumnSchema, 0, len(t.cols)), Indexes: make([]simpleIndexSchema, 0, len(t.indexes))}
	for _, c := range t.cols {
		dt := simpleDataType{MySQLType: c.typeName, Charset: c.charset, Collate: c.collate, Length: c.length,
			Elements: c.elements, Unsigned: c.unsigned, Zerofill: c.zerofill}
		if c.typeName != "float" && c.typeName != "double" {
			dt.Decimal = c.decimal
		}
		var def any
		if c.def != nil {
			def = *c.def
		}
		s.Columns = append(s.Columns, simpleColumnSchema{Name: c.name, DataType: dt, Nullable: c.nullable, Default: def})
	}
	for _, ix := range t.indexes {
		s.Indexes = append(s.Indexes, simpleIndexSchema{Name: ix.name, Unique: ix.unique, Primary: ix.primary,
			Nullable: ix.nullable, Columns: ix.columns})
	}
	return s
}

// simpleDDLType is tiflow simple getDDLType for the DDLs loadgen sends.
func simpleDDLType(ddlType int) string {
	if ddlType == ddlCreateTable {
		return "CREATE"
	}
	return "QUERY"
}

// encodeSimpleDDL writes a DDL; t is the table it creates (nil for CREATE DATABASE).
func encodeSimpleDDL(ev *open.Event, t *wireTable) ([]byte, error) {
	m := simpleMessage{Version: simpleVersion, Type: simpleDDLType(ev.DDLType), SQL: ev.Query, CommitTs: ev.CommitTs,
		BuildTs: time.Now().UnixMilli()}
	if t != nil {
		m.TableSchema = t.tableSchema()
	}
	return json.Marshal(m)
}

func encodeSimpleBootstrap(t *wireTable) ([]byte, error) {
	return json.Marshal(simpleMessage{Version: simpleVersion, Type: "BOOTSTRAP", BuildTs: time.Now().UnixMilli(),
		TableSchema: t.tableSchema()})
}

func encodeSimpleWatermark(ts uint64) []byte {
	b, _ := json.Marshal(simpleMessage{Version: simpleVersion, Type: "WATERMARK", CommitTs: ts, BuildTs: time.Now().UnixMilli()})
	return b
}

// simpleCoder writes row messages; location is TiCDC's time zone (TIMESTAMP values carry
// its name) and the zone the TIMESTAMP texts it is given are in.
type simpleCoder struct {
	location *time.Location
}

func (s *simpleCoder) encodeRow(ev *open.Event, t *wireTable) ([]byte, error) {
	m := simpleMessage{Version: simpleVersion, Schema: ev.Schema, Table: ev.Table, TableID: t.id, CommitTs: ev.CommitTs,
		BuildTs: time.Now().UnixMilli(), SchemaVersion: t.version, Checksum: &simpleChecksum{Version: checksumVersion}}
	var err error
	switch ev.Op {
	case open.OpInsert:
		m.Type = "INSERT"
		m.Data, m.Checksum.Current, err = s.image(ev.Columns, t)
	case open.OpDelete:
		m.Type = "DELETE"
		m.Old, m.Checksum.Previous, err = s.image(ev.Columns, t)
	case open.OpUpdate:
		m.Type = "UPDATE"
		if len(ev.OldColumns) == 0 {
			return nil, fmt.Errorf("%s.%s update without its old row", ev.Schema, ev.Table)
		}
		if m.Data, m.Checksum.Current, err = s.image(ev.Columns, t); err == nil {
			m.Old, m.Checksum.Previous, err = s.image(ev.OldColumns, t)
		}
	default:
		return nil, fmt.Errorf("%s.%s row with operation %v", ev.Schema, ev.Table, ev.Op)
	}
	if err != nil {
		return nil, fmt.Errorf("%s.%s: %w", ev.Schema, ev.Table, err)
	}
	return json.Marshal(m)
}

// image renders a row as formatColumns does and computes its checksum: CRC-32 (IEEE) over
// the non-NULL columns in column-ID order (TiDB's row checksum, tiflow
// pkg/sink/codec/common/verify_checksum.go; cdc/simple/doc.go).
func (s *simpleCoder) image(cols []open.Column, t *wireTable) (map[string]any, uint32, error) {
	out := make(map[string]any, len(cols))
	type hashed struct {
		pos int
		b   []byte
	}
	parts := make([]hashed, 0, len(cols))
	for i := range cols {
		c := &cols[i]
		pos := t.col(c.Name)
		if pos < 0 {
			return nil, 0, fmt.Errorf("column %s is not in the table's definition", c.Name)
		}
		if c.Value == nil {
			out[c.Name] = nil
			continue
		}
		v, h, err := s.value(c)
		if err != nil {
			return nil, 0, fmt.Errorf("column %s: %w", c.Name, err)
		}
		out[c.Name] = v
		parts = append(parts, hashed{pos, h})
	}
	// Columns arrive in table order; sort by position in case they do not.
	for i := 1; i < len(parts); i++ {
		for j := i; j > 0 && parts[j].pos < parts[j-1].pos; j-- {
			parts[j], parts[j-1] = parts[j-1], parts[j]
		}
	}
	var sum uint32
	for _, p := range parts {
		sum = crc32.Update(sum, crc32.IEEETable, p.b)
	}
	return out, sum, nil
}

// value returns a non-NULL column's JSON value (encodeValue) and its checksum bytes.
func (s *simpleCoder) value(c *open.Column) (any, []byte, error) {
	lenValue := func(b []byte) []byte {
		return append(binary.LittleEndian.AppendUint32(make([]byte, 0, 4+len(b)), uint32(len(b))), b...)
	}
	u64 := func(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
	switch v := c.Value.(type) {
	case int64:
		return strconv.FormatInt(v, 10), u64(uint64(v)), nil
	case uint64:
		return strconv.FormatUint(v, 10), u64(v), nil
	case float64:
		prec := 64
		if c.Type == open.TypeFloat {
			prec = 32
		}
		return strconv.FormatFloat(v, 'f', -1, prec), u64(math.Float64bits(v)), nil
	case []byte:
		if c.Flags&open.FlagBinary != 0 {
			return base64.StdEncoding.EncodeToString(v), lenValue(v), nil
		}
		return string(v), lenValue(v), nil
	case string:
		if c.Type != open.TypeTimestamp {
			return v, lenValue([]byte(v)), nil
		}
		utc, err := timestampUTC(v, s.location)
		if err != nil {
			return nil, nil, err
		}
		return map[string]string{"location": s.location.String(), "value": v}, lenValue([]byte(utc)), nil
	}
	return nil, nil, fmt.Errorf("unexpected value type %T", c.Value)
}

// timestampUTC converts a TIMESTAMP's text in loc to UTC, keeping its fractional digits;
// TiDB's zero TIMESTAMP stays as it is.
func timestampUTC(s string, loc *time.Location) (string, error) {
	layout := "2006-01-02 15:04:05"
	frac := 0
	if i := strings.IndexByte(s, '.'); i >= 0 {
		frac = len(s) - i - 1
		layout += "." + strings.Repeat("0", frac)
	}
	if strings.HasPrefix(s, "0000-00-00 00:00:00") {
		return s, nil
	}
	tm, err := time.ParseInLocation(layout, s, loc)
	if err != nil {
		return "", fmt.Errorf("timestamp %q: %w", s, err)
	}
	return tm.UTC().Format(layout), nil
}

// locationName returns the IANA name of a session time zone ("+00:00", "UTC",
// "Asia/Shanghai", "+08:00"), which simple's TIMESTAMP values carry (TiCDC's --tz is
// always a name): a whole-hour offset becomes "Etc/GMT∓H", "+00:00" "UTC".
func locationName(tz string) (*time.Location, error) {
	switch strings.ToUpper(tz) {
	case "+00:00", "-00:00", "UTC", "SYSTEM":
		if strings.EqualFold(tz, "SYSTEM") {
			return nil, fmt.Errorf("time-zone SYSTEM has no name for simple's TIMESTAMP location; name the zone")
		}
		return time.UTC, nil
	}
	if len(tz) == 6 && (tz[0] == '+' || tz[0] == '-') && tz[3] == ':' {
		h, err1 := strconv.Atoi(tz[1:3])
		m, err2 := strconv.Atoi(tz[4:6])
		if err1 != nil || err2 != nil || m != 0 || h > 14 {
			return nil, fmt.Errorf("time-zone %q: simple's TIMESTAMP location needs a zone name (a whole-hour offset or an IANA name)", tz)
		}
		sign := "-" // Etc/GMT-8 is UTC+8
		if tz[0] == '-' {
			sign = "+"
		}
		return time.LoadLocation(fmt.Sprintf("Etc/GMT%s%d", sign, h))
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return nil, fmt.Errorf("time-zone %q: %w", tz, err)
	}
	return loc, nil
}

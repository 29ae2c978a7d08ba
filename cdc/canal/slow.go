package canal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tidb-parity/parity/cdc/open"
)

// message is one canal-json message as TiCDC writes it (tiflow
// pkg/sink/codec/canal/canal_json_message.go, canalJSONMessageWithTiDBExtension).
type message struct {
	Database  string            `json:"database"`
	Table     string            `json:"table"`
	PKNames   []string          `json:"pkNames"`
	IsDDL     bool              `json:"isDdl"`
	Type      string            `json:"type"`
	SQL       string            `json:"sql"`
	MySQLType map[string]string `json:"mysqlType"`
	Data      []json.RawMessage `json:"data"`
	Old       []json.RawMessage `json:"old"`
	TiDB      *struct {
		CommitTs      *uint64 `json:"commitTs"`
		WatermarkTs   *uint64 `json:"watermarkTs"`
		OnlyHandleKey bool    `json:"onlyHandleKey"`
		ClaimCheck    string  `json:"claimCheckLocation"`
	} `json:"_tidb"`
}

// decodeSlow is the decoder built on encoding/json: Decode's fallback for every record
// the fast path does not decode (any error, and shapes TiCDC does not write, such as
// repeated or case-folded member names), so the rules and the errors are its.
func decodeSlow(value []byte) ([]open.Event, error) {
	var m message
	if err := json.Unmarshal(value, &m); err != nil {
		return nil, fail(jsonField(err), ErrSyntax, "%v", err)
	}
	if m.TiDB == nil {
		return nil, fail("_tidb", ErrNoExtension, "")
	}
	if m.Type == "TIDB_WATERMARK" {
		if m.TiDB.WatermarkTs == nil {
			return nil, fail("_tidb.watermarkTs", ErrMissingField, "")
		}
		return []open.Event{{Kind: open.KindResolved, CommitTs: *m.TiDB.WatermarkTs}}, nil
	}
	if m.TiDB.CommitTs == nil || *m.TiDB.CommitTs == 0 {
		return nil, fail("_tidb.commitTs", ErrMissingField, "")
	}
	ts := *m.TiDB.CommitTs
	if m.IsDDL {
		if strings.TrimSpace(m.SQL) == "" {
			return nil, fail("sql", ErrMissingField, "a DDL without its statement")
		}
		return []open.Event{{Kind: open.KindDDL, CommitTs: ts, Schema: m.Database, Table: m.Table, Query: m.SQL}}, nil
	}
	var op open.Op
	switch m.Type {
	case "INSERT":
		op = open.OpInsert
	case "UPDATE":
		op = open.OpUpdate
	case "DELETE":
		op = open.OpDelete
	default:
		return nil, fail("type", ErrKind, "%q", m.Type)
	}
	if m.Table == "" {
		return nil, fail("table", ErrMissingField, "")
	}
	if len(m.Data) == 0 {
		return nil, fail("data", ErrMissingField, "a %s without rows", m.Type)
	}
	if op == open.OpUpdate && len(m.Old) != len(m.Data) {
		return nil, fail("old", ErrMissingField, "an UPDATE with %d rows in data and %d in old", len(m.Data), len(m.Old))
	}
	types, err := columnTypes(m.MySQLType)
	if err != nil {
		return nil, err
	}
	pk := map[string]bool{}
	for _, n := range m.PKNames {
		if _, ok := types[n]; !ok {
			return nil, fail("pkNames", ErrMissingField, "primary-key column %q has no mysqlType", n)
		}
		pk[n] = true
	}
	evs := make([]open.Event, 0, len(m.Data))
	for i, raw := range m.Data {
		ev := open.Event{Kind: open.KindRow, CommitTs: ts, Schema: m.Database, Table: m.Table, Op: op,
			OnlyHandleKey: m.TiDB.OnlyHandleKey || m.TiDB.ClaimCheck != "", ClaimCheckLocation: m.TiDB.ClaimCheck}
		if ev.Columns, err = row(fmt.Sprintf("data[%d]", i), raw, types, pk); err != nil {
			err.(*DecodeError).Row = i
			return nil, err
		}
		if op == open.OpUpdate {
			if ev.OldColumns, err = row(fmt.Sprintf("old[%d]", i), m.Old[i], types, pk); err != nil {
				err.(*DecodeError).Row = i
				return nil, err
			}
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// row decodes one element of data or old: a JSON object of column name → string or null,
// in the table's column order.
func row(field string, raw json.RawMessage, types map[string]colType, pk map[string]bool) ([]open.Column, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, fail(field, ErrSyntax, "%v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fail(field, ErrValue, "a row is not an object")
	}
	cols := make([]open.Column, 0, len(types))
	seen := make(map[string]bool, len(types))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fail(field, ErrSyntax, "%v", err)
		}
		name := tok.(string) // object keys are strings
		f := field + "." + name
		if seen[name] {
			return nil, fail(f, ErrValue, "column twice in one row")
		}
		seen[name] = true
		t, ok := types[name]
		if !ok {
			return nil, fail(f, ErrMissingField, "column has no mysqlType")
		}
		tok, err = dec.Token()
		if err != nil {
			return nil, fail(f, ErrSyntax, "%v", err)
		}
		c := open.Column{Name: name, Type: t.code, Flags: t.flags}
		if pk[name] {
			c.Flags |= open.FlagPrimaryKey | open.FlagHandleKey
		}
		switch v := tok.(type) {
		case nil:
		case string:
			if c.Value, err = value(v, t); err != nil {
				return nil, fail(f, ErrValue, "%v", err)
			}
		default:
			return nil, fail(f, ErrValue, "%T, want a string or null", tok)
		}
		cols = append(cols, c)
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, fail(field, ErrSyntax, "%v", err)
	}
	for n := range pk {
		if !seen[n] {
			return nil, fail(field+"."+n, ErrMissingField, "primary-key column missing from the row")
		}
	}
	if len(cols) == 0 {
		return nil, fail(field, ErrMissingField, "a row without columns")
	}
	return cols, nil
}

// value turns a canal-json string into the Go value cdc/open decodes the same column to.
func value(s string, t colType) (any, error) {
	switch t.kind {
	case kindSigned:
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, err
		}
		lo, hi := signedRange(t.code)
		if v < lo || v > hi {
			return nil, fmt.Errorf("%d out of range", v)
		}
		return v, nil
	case kindUnsigned:
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, err
		}
		if hi := unsignedMax(t.code); v > hi {
			return nil, fmt.Errorf("%d out of range", v)
		}
		return v, nil
	case kindUint:
		return strconv.ParseUint(s, 10, 64)
	case kindFloat:
		v, err := strconv.ParseFloat(s, 32)
		if err != nil {
			return nil, err
		}
		return float64(float32(v)), nil
	case kindDouble:
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, err
		}
		if math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("%q is not a finite number", s)
		}
		return v, nil
	case kindBytes:
		return latin1(s)
	}
	return s, nil
}

// jsonField names where encoding/json failed, when it says.
func jsonField(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return te.Field
	}
	return ""
}

package simple

import (
	"fmt"
	"slices"
	"strings"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
	"github.com/tidb-parity/parity/cdc/open"
)

// wireTableSchema is a DDL or BOOTSTRAP message's tableSchema/preTableSchema
// (tiflow pkg/sink/codec/simple/message.go TableSchema).
type wireTableSchema struct {
	Schema  string       `json:"schema"`
	Table   string       `json:"table"`
	TableID int64        `json:"tableID"`
	Version uint64       `json:"version"`
	Columns []wireColumn `json:"columns"`
	Indexes []wireIndex  `json:"indexes"`
}

type wireColumn struct {
	Name     string       `json:"name"`
	DataType wireDataType `json:"dataType"`
	Nullable bool         `json:"nullable"`
	Default  any          `json:"default"`
}

type wireDataType struct {
	MySQLType string   `json:"mysqlType"`
	Charset   string   `json:"charset"`
	Collate   string   `json:"collate"`
	Length    int64    `json:"length"`
	Decimal   int      `json:"decimal"`
	Elements  []string `json:"elements"`
	Unsigned  bool     `json:"unsigned"`
	Zerofill  bool     `json:"zerofill"`
}

type wireIndex struct {
	Name     string   `json:"name"`
	Unique   bool     `json:"unique"`
	Primary  bool     `json:"primary"`
	Nullable bool     `json:"nullable"`
	Columns  []string `json:"columns"`
}

// column is one column of a cached table schema.
type column struct {
	name     string
	typ      byte       // MySQL type code, as open.Column.Type
	flags    open.Flag  // as open.Column.Flags (never FlagGenerated: simple does not say)
	class    valueClass // how the value is carried and hashed
	elements int        // ENUM/SET members
	bits     int64      // BIT width
	plain    bool       // jsonscan.Plain(name): the fast path may compare a member's bytes
}

// table is one cached (schema, table, version).
type table struct {
	schema, name string
	version      uint64
	cols         []column
	byName       map[string]int
	handle       []int // column positions of the handle key; nil for a keyless table
	// The columns in the order of their names' bytes, the order TiCDC writes a row
	// image's members in (encoding/json sorts a map's keys), and each column's place in
	// it: the fast path expects the next member to name the next column of this order
	// before it looks the name up.
	sorted, rank []int
}

// typeCodes maps tiflow's types.TypeToStr names (charset-dependent for strings) to the
// MySQL type code open.Column.Type carries.
var typeCodes = map[string]byte{
	"tinyint": open.TypeTiny, "smallint": open.TypeShort, "mediumint": open.TypeInt24,
	"int": open.TypeLong, "bigint": open.TypeLonglong, "year": open.TypeYear,
	"float": open.TypeFloat, "double": open.TypeDouble, "decimal": open.TypeNewDecimal,
	"date": open.TypeDate, "datetime": open.TypeDatetime, "timestamp": open.TypeTimestamp, "time": open.TypeDuration,
	"varchar": open.TypeVarchar, "varbinary": open.TypeVarchar, "char": open.TypeString, "binary": open.TypeString,
	"tinytext": open.TypeTinyBlob, "tinyblob": open.TypeTinyBlob, "text": open.TypeBlob, "blob": open.TypeBlob,
	"mediumtext": open.TypeMediumBlob, "mediumblob": open.TypeMediumBlob, "longtext": open.TypeLongBlob, "longblob": open.TypeLongBlob,
	"bit": open.TypeBit, "enum": open.TypeEnum, "set": open.TypeSet, "json": open.TypeJSON,
}

// valueClass groups column types by how their value is carried and hashed.
type valueClass uint8

const (
	classInt       valueClass = iota + 1 // decimal text → int64 (uint64 when unsigned); hashed as uint64
	classYear                            // decimal text → int64; hashed as uint64
	classUint                            // ENUM, SET, BIT: decimal text → uint64
	classFloat                           // text → float32 widened to float64; hashed as float64 bits
	classDouble                          // text → float64
	classText                            // DECIMAL, DATE, DATETIME, TIME, JSON: text kept; hashed as length+bytes
	classTimestamp                       // {location, value}; hashed as the UTC text
	classString                          // CHAR/VARCHAR/TEXT: text; BINARY/VARBINARY/BLOB: base64 → []byte
)

func classOf(t byte) valueClass {
	switch t {
	case open.TypeTiny, open.TypeShort, open.TypeInt24, open.TypeLong, open.TypeLonglong:
		return classInt
	case open.TypeYear:
		return classYear
	case open.TypeEnum, open.TypeSet, open.TypeBit:
		return classUint
	case open.TypeFloat:
		return classFloat
	case open.TypeDouble:
		return classDouble
	case open.TypeTimestamp:
		return classTimestamp
	case open.TypeNewDecimal, open.TypeDate, open.TypeDatetime, open.TypeDuration, open.TypeJSON:
		return classText
	}
	return classString
}

// newTable validates a wire schema and builds the cached form. TiCDC's handle is the
// index marked primary (TiCDC appends a "primary" index holding its handle, the NOT NULL
// unique index with the fewest columns, when the table has no primary key); a table
// without one is keyless.
func newTable(w *wireTableSchema) (*table, error) {
	if w.Schema == "" || w.Table == "" {
		return nil, fmt.Errorf("%w: empty schema or table name", ErrSchema)
	}
	if len(w.Columns) == 0 {
		return nil, fmt.Errorf("%w: table %s.%s has no columns", ErrSchema, w.Schema, w.Table)
	}
	t := &table{schema: w.Schema, name: w.Table, version: w.Version, byName: make(map[string]int, len(w.Columns))}
	for i, c := range w.Columns {
		where := fmt.Sprintf("columns[%d]", i)
		if c.Name == "" {
			return nil, fmt.Errorf("%w: %s has no name", ErrSchema, where)
		}
		if _, dup := t.byName[c.Name]; dup {
			return nil, fmt.Errorf("%w: %s: column %s named twice", ErrSchema, where, c.Name)
		}
		mt := strings.ToLower(c.DataType.MySQLType)
		code, ok := typeCodes[mt]
		if !ok {
			return nil, fmt.Errorf("%w %q (column %s)", ErrUnknownType, c.DataType.MySQLType, c.Name)
		}
		col := column{name: c.Name, typ: code, class: classOf(code), plain: jsonscan.Plain(c.Name)}
		binary := strings.EqualFold(c.DataType.Charset, "binary")
		if col.class == classString && c.DataType.Charset == "" {
			return nil, fmt.Errorf("%w: column %s (%s) has no charset, so binary and text values cannot be told apart", ErrSchema, c.Name, mt)
		}
		if binary || col.class != classString {
			col.flags |= open.FlagBinary
		}
		if c.Nullable {
			col.flags |= open.FlagNullable
		}
		if c.DataType.Unsigned && col.class == classInt {
			col.flags |= open.FlagUnsigned
		}
		switch code {
		case open.TypeEnum, open.TypeSet:
			col.elements = len(c.DataType.Elements)
			if code == open.TypeSet && col.elements > 64 {
				return nil, fmt.Errorf("%w: SET column %s has %d members (at most 64)", ErrSchema, c.Name, col.elements)
			}
		case open.TypeBit:
			col.bits = c.DataType.Length
			if col.bits < 1 || col.bits > 64 {
				return nil, fmt.Errorf("%w: BIT column %s has length %d (want 1..64)", ErrSchema, c.Name, col.bits)
			}
		}
		t.byName[c.Name] = i
		t.cols = append(t.cols, col)
	}
	t.sorted = make([]int, len(t.cols))
	for i := range t.sorted {
		t.sorted[i] = i
	}
	slices.SortFunc(t.sorted, func(a, b int) int { return strings.Compare(t.cols[a].name, t.cols[b].name) })
	t.rank = make([]int, len(t.cols))
	for r, i := range t.sorted {
		t.rank[i] = r
	}
	var idxCols [][]int
	for i, ix := range w.Indexes {
		cols := make([]int, 0, len(ix.Columns))
		for _, name := range ix.Columns {
			p, ok := t.byName[name]
			if !ok {
				return nil, fmt.Errorf("%w: indexes[%d] (%s) names column %q, which the table does not have", ErrSchema, i, ix.Name, name)
			}
			cols = append(cols, p)
		}
		if len(cols) == 0 {
			return nil, fmt.Errorf("%w: indexes[%d] (%s) has no columns", ErrSchema, i, ix.Name)
		}
		idxCols = append(idxCols, cols)
	}
	handle := -1
	for i, ix := range w.Indexes {
		if ix.Primary {
			if handle >= 0 {
				return nil, fmt.Errorf("%w: two primary indexes (%s, %s)", ErrSchema, w.Indexes[handle].Name, ix.Name)
			}
			handle = i
		}
	}
	// TiCDC's flags (tiflow initColumnsFlag): every column of every index. A "primary"
	// index that repeats a unique index's columns is TiCDC's stand-in for a handle on a
	// table without a primary key, not a primary key.
	for i, ix := range w.Indexes {
		cols := idxCols[i]
		synthetic := ix.Primary && slices.ContainsFunc(w.Indexes, func(o wireIndex) bool {
			return !o.Primary && o.Unique && slices.Equal(o.Columns, ix.Columns)
		})
		for _, c := range cols {
			switch {
			case ix.Primary && !synthetic:
				t.cols[c].flags |= open.FlagPrimaryKey
			case ix.Unique && !ix.Primary:
				t.cols[c].flags |= open.FlagUniqueKey
			}
			if len(cols) > 1 || (!ix.Unique && !ix.Primary) {
				t.cols[c].flags |= open.FlagMultipleKey
			}
			if i == handle {
				t.cols[c].flags |= open.FlagHandleKey
			}
		}
	}
	if handle >= 0 {
		t.handle = idxCols[handle]
	}
	return t, nil
}

func (t *table) qualified() string { return t.schema + "." + t.name }

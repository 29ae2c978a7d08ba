package upstream

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
)

// Table is the load generator's view of one upstream table: its columns in table order with
// the type codes and flags TiCDC puts into open-protocol events.
type Table struct {
	Schema  string
	Name    string
	Columns []Column
	// Handle lists the positions of the handle-key columns in Columns; empty for a table
	// with neither a primary key nor a NOT NULL unique key (replicated only with TiCDC's
	// force-replicate, matched downstream on all columns).
	Handle []int
	// IntHandle is true when the handle is a single integer primary key (TiDB's
	// PK-is-handle); its value is then TiCDC's "rid".
	IntHandle bool
}

// Column is one column of a Table.
type Column struct {
	Name     string
	DataType string // information_schema DATA_TYPE, lower case ("int", "varchar", ...)
	Type     byte   // MySQL type code of the open protocol ("t")
	Flags    open.Flag
}

// Col returns the position of the named column, or -1.
func (t *Table) Col(name string) int {
	for i, c := range t.Columns {
		if strings.EqualFold(c.Name, name) {
			return i
		}
	}
	return -1
}

// typeCodes maps information_schema DATA_TYPE to the type code TiCDC emits.
var typeCodes = map[string]byte{
	"tinyint": open.TypeTiny, "smallint": open.TypeShort, "mediumint": open.TypeInt24,
	"int": open.TypeLong, "integer": open.TypeLong, "bigint": open.TypeLonglong,
	"float": open.TypeFloat, "double": open.TypeDouble, "real": open.TypeDouble,
	"decimal": open.TypeNewDecimal, "numeric": open.TypeNewDecimal,
	"date": open.TypeDate, "datetime": open.TypeDatetime, "timestamp": open.TypeTimestamp,
	"time": open.TypeDuration, "year": open.TypeYear,
	"char": open.TypeString, "binary": open.TypeString,
	"varchar": open.TypeVarchar, "varbinary": open.TypeVarchar,
	"tinytext": open.TypeTinyBlob, "tinyblob": open.TypeTinyBlob,
	"text": open.TypeBlob, "blob": open.TypeBlob,
	"mediumtext": open.TypeMediumBlob, "mediumblob": open.TypeMediumBlob,
	"longtext": open.TypeLongBlob, "longblob": open.TypeLongBlob,
	"bit": open.TypeBit, "json": open.TypeJSON, "enum": open.TypeEnum, "set": open.TypeSet,
}

// hasCharset reports whether TiDB gives a column of this data type a real character set;
// every other type has charset "binary" and so TiCDC's binary flag (TiDB
// types.HasCharset).
func hasCharset(dataType string) bool {
	switch dataType {
	case "char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set":
		return true
	}
	return false
}

// index is one index as information_schema.STATISTICS describes it.
type index struct {
	name    string
	unique  bool
	primary bool
	cols    []int
}

type columnDef struct {
	name, dataType, columnType, extra string
	nullable                          bool
}

// ErrNoTable is LoadDefs' and LoadTable's error for a table that does not exist.
var ErrNoTable = errors.New("does not exist")

// LoadTable reads a table's definition from TiDB's information_schema and computes the
// column flags the way TiCDC does (tiflow cdc/model/schema_storage.go initColumnsFlag on
// top of the column flags TiDB's DDL sets).
func LoadTable(ctx context.Context, db Querier, schema, table string) (*Table, error) {
	cols, idxs, err := LoadDefs(ctx, db, schema, table)
	if err != nil {
		return nil, err
	}
	return NewTable(schema, table, cols, idxs)
}

// LoadDefs reads a table's column and index definitions from information_schema (TiDB's
// or MySQL's), as NewTable takes them; an index's expression parts are left out.
func LoadDefs(ctx context.Context, db Querier, schema, table string) ([]ColumnDef, []IndexDef, error) {
	rows, err := db.QueryContext(ctx, `SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, EXTRA
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, schema, table)
	if err != nil {
		return nil, nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
	}
	var cols []ColumnDef
	pos := map[string]string{} // lower-case name → name
	for rows.Next() {
		var c ColumnDef
		var columnType, nullable, extra string
		if err := rows.Scan(&c.Name, &c.DataType, &columnType, &nullable, &extra); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
		}
		c.DataType = strings.ToLower(c.DataType)
		c.Unsigned = strings.Contains(strings.ToLower(columnType), "unsigned")
		c.Nullable = nullable == "YES"
		c.Generated = strings.Contains(strings.ToLower(extra), "generated") // TiDB and MariaDB say "STORED GENERATED"
		cols = append(cols, c)
		pos[strings.ToLower(c.Name)] = c.Name
	}
	if err := rows.Close(); err != nil {
		return nil, nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
	}
	if len(cols) == 0 {
		return nil, nil, fmt.Errorf("table %s.%s %w", schema, table, ErrNoTable)
	}

	rows, err = db.QueryContext(ctx, `SELECT INDEX_NAME, NON_UNIQUE, COLUMN_NAME FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY INDEX_NAME, SEQ_IN_INDEX`, schema, table)
	if err != nil {
		return nil, nil, fmt.Errorf("read indexes of %s.%s: %w", schema, table, err)
	}
	var idxs []IndexDef
	byName := map[string]int{}
	for rows.Next() {
		var name, col string
		var nonUnique int
		if err := rows.Scan(&name, &nonUnique, &col); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("read indexes of %s.%s: %w", schema, table, err)
		}
		i, ok := byName[name]
		if !ok {
			i = len(idxs)
			byName[name] = i
			idxs = append(idxs, IndexDef{Name: name, Unique: nonUnique == 0, Primary: strings.EqualFold(name, "PRIMARY")})
		}
		c, ok := pos[strings.ToLower(col)]
		if !ok {
			continue // an expression index part
		}
		idxs[i].Columns = append(idxs[i].Columns, c)
	}
	if err := rows.Close(); err != nil {
		return nil, nil, fmt.Errorf("read indexes of %s.%s: %w", schema, table, err)
	}
	return cols, idxs, nil
}

// ColumnDef is a column as a DDL defines it (for NewTable).
type ColumnDef struct {
	Name      string
	DataType  string // TiDB's type name: "int", "varbinary", "text", "blob", ...
	Unsigned  bool
	Nullable  bool
	Generated bool
}

// IndexDef is an index as a DDL defines it (for NewTable). Columns name the indexed
// columns in index order; an expression part is left out.
type IndexDef struct {
	Name            string
	Primary, Unique bool
	Columns         []string
}

// NewTable computes the type codes and flags TiCDC gives a table defined by cols and
// idxs, exactly as LoadTable does for a table read from information_schema: the view of
// a table a consumer builds from the changefeed's own DDLs.
func NewTable(schema, name string, cols []ColumnDef, idxs []IndexDef) (*Table, error) {
	defs := make([]columnDef, len(cols))
	pos := map[string]int{}
	for i, c := range cols {
		d := columnDef{name: c.Name, dataType: strings.ToLower(c.DataType), nullable: c.Nullable}
		if c.Unsigned {
			d.columnType = "unsigned"
		}
		if c.Generated {
			d.extra = "generated"
		}
		defs[i] = d
		pos[strings.ToLower(c.Name)] = i
	}
	ixs := make([]*index, 0, len(idxs))
	for _, x := range idxs {
		ix := &index{name: x.Name, unique: x.Unique || x.Primary, primary: x.Primary}
		for _, c := range x.Columns {
			p, ok := pos[strings.ToLower(c)]
			if !ok {
				return nil, fmt.Errorf("table %s.%s: index %s names column %s, which the table does not have", schema, name, x.Name, c)
			}
			ix.cols = append(ix.cols, p)
		}
		ixs = append(ixs, ix)
	}
	return buildTable(schema, name, defs, ixs)
}

// buildTable computes type codes and flags from column and index definitions.
func buildTable(schema, name string, defs []columnDef, idxs []*index) (*Table, error) {
	// Primary first, then unique, then by name: a stable order standing in for index IDs.
	sort.SliceStable(idxs, func(i, j int) bool {
		if idxs[i].primary != idxs[j].primary {
			return idxs[i].primary
		}
		return false
	})
	t := &Table{Schema: schema, Name: name}
	var flags []open.Flag
	for _, d := range defs {
		code, ok := typeCodes[d.dataType]
		if !ok {
			return nil, fmt.Errorf("table %s.%s column %s: unsupported type %q", schema, name, d.name, d.dataType)
		}
		var f open.Flag
		if !hasCharset(d.dataType) {
			f |= open.FlagBinary
		}
		if strings.Contains(d.extra, "generated") {
			f |= open.FlagGenerated
		}
		if d.nullable {
			f |= open.FlagNullable
		}
		if strings.Contains(d.columnType, "unsigned") {
			f |= open.FlagUnsigned
		}
		t.Columns = append(t.Columns, Column{Name: d.name, DataType: d.dataType, Type: code})
		flags = append(flags, f)
	}
	// TiDB's DDL column flags: PRI on every primary-key column; UNI on the column of a
	// single-column unique index; MUL on the first column of any other index.
	for _, ix := range idxs {
		if len(ix.cols) == 0 {
			continue
		}
		switch {
		case ix.primary:
			for _, c := range ix.cols {
				flags[c] |= open.FlagPrimaryKey
			}
		case ix.unique && len(ix.cols) == 1:
			flags[ix.cols[0]] |= open.FlagUniqueKey
		default:
			flags[ix.cols[0]] |= open.FlagMultipleKey
		}
	}
	// The handle: the primary key, else the NOT NULL unique index with the fewest columns.
	var handle *index
	for _, ix := range idxs {
		if len(ix.cols) == 0 || !ix.unique {
			continue
		}
		if !ix.primary {
			notNull := true
			for _, c := range ix.cols {
				if defs[c].nullable || flags[c]&open.FlagGenerated != 0 {
					notNull = false
				}
			}
			if !notNull {
				continue
			}
		}
		if ix.primary {
			handle = ix
			break
		}
		if handle == nil || len(ix.cols) < len(handle.cols) {
			handle = ix
		}
	}
	// TiCDC then marks every column of every index.
	for _, ix := range idxs {
		for _, c := range ix.cols {
			if ix.primary {
				flags[c] |= open.FlagPrimaryKey
			} else if ix.unique {
				flags[c] |= open.FlagUniqueKey
			}
			if len(ix.cols) > 1 {
				flags[c] |= open.FlagMultipleKey
			}
			if ix == handle {
				flags[c] |= open.FlagHandleKey
			}
		}
	}
	for i := range t.Columns {
		t.Columns[i].Flags = flags[i]
	}
	if handle != nil {
		t.Handle = append([]int(nil), handle.cols...)
		if handle.primary && len(handle.cols) == 1 {
			switch defs[handle.cols[0]].dataType {
			case "tinyint", "smallint", "mediumint", "int", "integer", "bigint":
				t.IntHandle = true
			}
		}
	}
	return t, nil
}

// SelectList renders the columns for a SELECT whose results ScanRows understands: ENUM,
// SET and BIT are read as numbers (TiCDC sends the ENUM index, the SET bitmask and the BIT
// value as integers), FLOAT as a DOUBLE (TiDB prints a FLOAT with 6 significant digits,
// which loses bits of most float32 values; the DOUBLE is the float32 exactly).
func (t *Table) SelectList() string {
	var b strings.Builder
	for i, c := range t.Columns {
		if i > 0 {
			b.WriteString(", ")
		}
		switch c.DataType {
		case "enum", "set", "bit":
			b.WriteString("(" + ident.Quote(c.Name) + "+0)")
		case "float":
			b.WriteString("CAST(" + ident.Quote(c.Name) + " AS DOUBLE)")
		default:
			b.WriteString(ident.Quote(c.Name))
		}
	}
	return b.String()
}

// Convert turns one value read with the text protocol (nil or bytes) into the typed Go
// value of open.Column.Value for this column.
func (c Column) Convert(raw []byte) (any, error) {
	if raw == nil {
		return nil, nil
	}
	s := string(raw)
	switch c.DataType {
	case "tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year":
		if c.Flags&open.FlagUnsigned != 0 {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("column %s: %w", c.Name, err)
			}
			return v, nil
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.Name, err)
		}
		return v, nil
	case "bit", "enum", "set":
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.Name, err)
		}
		return v, nil
	case "float":
		v, err := strconv.ParseFloat(s, 32)
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.Name, err)
		}
		return float64(float32(v)), nil
	case "double", "real":
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.Name, err)
		}
		return v, nil
	case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
		return append([]byte{}, raw...), nil
	}
	// DECIMAL, temporal types, JSON and character columns.
	return s, nil
}

// QualifiedName returns `schema`.`table`.
func (t *Table) QualifiedName() string { return ident.Quote(t.Schema) + "." + ident.Quote(t.Name) }

// ScanRows reads every row of rows as open.Column slices of table t. rows must select
// t.SelectList() (optionally preceded by extra leading columns, returned raw in lead).
func ScanRows(rows *sql.Rows, t *Table, extra int) (images [][]open.Column, lead [][][]byte, err error) {
	defer rows.Close()
	n := extra + len(t.Columns)
	raw := make([]sql.RawBytes, n)
	dest := make([]any, n)
	for i := range raw {
		dest[i] = &raw[i]
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, fmt.Errorf("scan %s: %w", t.QualifiedName(), err)
		}
		img := make([]open.Column, len(t.Columns))
		for i, c := range t.Columns {
			v, err := c.Convert(raw[extra+i])
			if err != nil {
				return nil, nil, fmt.Errorf("table %s: %w", t.QualifiedName(), err)
			}
			img[i] = open.Column{Name: c.Name, Type: c.Type, Flags: c.Flags, Value: v}
		}
		images = append(images, img)
		if extra > 0 {
			l := make([][]byte, extra)
			for i := 0; i < extra; i++ {
				if raw[i] != nil {
					l[i] = append([]byte{}, raw[i]...)
				}
			}
			lead = append(lead, l)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", t.QualifiedName(), err)
	}
	return images, lead, nil
}

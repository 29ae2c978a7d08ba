package loadgen

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tidb-parity/parity/cdc/upstream"
)

// wireTable is what canal-json and simple say of a table beyond the type codes and flags
// of upstream.Table: TiDB's type names, character sets, lengths, ENUM/SET members,
// defaults, indexes, the table ID and the schema version. It is read from TiDB's
// information_schema (and the DDL history for the version), as TiCDC reads the same
// facts from TiDB's schema (tiflow pkg/sink/codec/simple/message.go newTableSchema).
type wireTable struct {
	schema, name string
	id           int64
	// version is TiCDC's TableInfo.UpdateTS: the start ts of the last DDL job that changed
	// the table, from mysql.tidb_ddl_history; when that cannot be read, a TSO loadgen
	// takes when it loads the definition (simple only matches it between schema and rows).
	version uint64
	cols    []wireColumn // in column-ID order (ORDINAL_POSITION: loadgen never reorders columns)
	indexes []wireIndex  // TiCDC's order: TiDB's indexes by ID, then a synthetic "primary"
}

// wireColumn is one column as TiDB's ColumnInfo describes it.
type wireColumn struct {
	name     string
	typeName string // types.TypeToStr: information_schema DATA_TYPE ("varbinary", "text", "bigint", ...)
	charset  string // "binary" for every type without a character set
	collate  string
	length   int64 // TiDB's flen
	decimal  int   // scale or fractional seconds; not given for FLOAT/DOUBLE
	elements []string
	unsigned bool // TiDB's flag: also on BIT and YEAR
	zerofill bool // also on YEAR
	nullable bool
	def      *string // the default as TiDB keeps it (a string), nil for none
}

type wireIndex struct {
	name                      string
	unique, primary, nullable bool
	columns                   []string
}

// mysqlType is canal-json's mysqlType of the column (tiflow utils.GetMySQLType without
// content-compatible): the type name, " unsigned" (not for BIT and YEAR), " zerofill"
// (not for YEAR).
func (c *wireColumn) mysqlType() string {
	s := c.typeName
	if c.unsigned && s != "bit" && s != "year" {
		s += " unsigned"
	}
	if c.zerofill && s != "year" {
		s += " zerofill"
	}
	return s
}

// loadWireTable reads a table's wire schema from TiDB; its version is 0 when the DDL
// history does not give it.
func loadWireTable(ctx context.Context, db *sql.DB, schema, table string) (*wireTable, error) {
	t := &wireTable{schema: schema, name: table}
	err := db.QueryRowContext(ctx, `SELECT TIDB_TABLE_ID FROM information_schema.TABLES
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?`, schema, table).Scan(&t.id)
	if err != nil {
		return nil, fmt.Errorf("read table id of %s.%s: %w", schema, table, err)
	}
	rows, err := db.QueryContext(ctx, `SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT,
			IFNULL(CHARACTER_SET_NAME, 'binary'), IFNULL(COLLATION_NAME, 'binary'),
			IFNULL(CHARACTER_MAXIMUM_LENGTH, 0), IFNULL(NUMERIC_PRECISION, 0), IFNULL(NUMERIC_SCALE, 0),
			IFNULL(DATETIME_PRECISION, 0)
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, schema, table)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
	}
	for rows.Next() {
		var c wireColumn
		var colType, nullable string
		var def sql.NullString
		var charLen, numPrec, numScale int64
		var fsp int
		if err := rows.Scan(&c.name, &c.typeName, &colType, &nullable, &def, &c.charset, &c.collate,
			&charLen, &numPrec, &numScale, &fsp); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
		}
		c.typeName = strings.ToLower(c.typeName)
		colType = strings.ToLower(colType)
		c.nullable = nullable == "YES"
		if def.Valid {
			c.def = &def.String
		}
		if err := c.size(colType, charLen, numPrec, numScale, fsp); err != nil {
			rows.Close()
			return nil, fmt.Errorf("table %s.%s column %s: %w", schema, table, c.name, err)
		}
		t.cols = append(t.cols, c)
	}
	if err := rows.Close(); err != nil {
		return nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
	}
	if len(t.cols) == 0 {
		return nil, fmt.Errorf("table %s.%s does not exist", schema, table)
	}
	if err := t.loadIndexes(ctx, db); err != nil {
		return nil, err
	}
	var v sql.NullInt64
	// The history's job_meta is the job's JSON; a failure to read it (privileges, another
	// TiDB version) leaves the fallback.
	err = db.QueryRowContext(ctx, `SELECT JSON_EXTRACT(CONVERT(job_meta USING utf8mb4), '$.binlog.TableInfo.update_timestamp')
		FROM mysql.tidb_ddl_history WHERE table_ids = ? ORDER BY job_id DESC LIMIT 1`, strconv.FormatInt(t.id, 10)).Scan(&v)
	if err == nil && v.Valid && v.Int64 > 0 {
		t.version = uint64(v.Int64)
	}
	return t, nil
}

// size fills length, decimal, elements, unsigned and zerofill as TiDB's field type has
// them.
func (c *wireColumn) size(colType string, charLen, numPrec, numScale int64, fsp int) error {
	c.unsigned = strings.Contains(colType, "unsigned")
	c.zerofill = strings.Contains(colType, "zerofill")
	switch c.typeName {
	case "tinyint", "smallint", "mediumint", "int", "bigint", "float", "double", "bit":
		c.length = numPrec
		if c.typeName == "bit" {
			c.unsigned = true
		}
	case "decimal":
		c.length, c.decimal = numPrec, int(numScale)
	case "year":
		c.length, c.unsigned, c.zerofill = 4, true, true
	case "date":
		c.length = 10
	case "datetime", "timestamp", "time":
		c.length = 19
		if c.typeName == "time" {
			c.length = 10
		}
		if fsp > 0 {
			c.length += 1 + int64(fsp)
		}
		c.decimal = fsp
	case "json":
		c.length = 4294967295
	case "enum", "set":
		c.length = charLen
		els, err := parseElements(colType)
		if err != nil {
			return err
		}
		c.elements = els
	default: // character and binary strings
		c.length = charLen
	}
	return nil
}

// parseElements reads the members of "enum('a','b')" or "set('x','y')".
func parseElements(colType string) ([]string, error) {
	open, end := strings.IndexByte(colType, '('), strings.LastIndexByte(colType, ')')
	if open < 0 || end < open {
		return nil, fmt.Errorf("cannot read members of %q", colType)
	}
	s := colType[open+1 : end]
	var out []string
	for len(s) > 0 {
		if s[0] != '\'' {
			return nil, fmt.Errorf("cannot read members of %q", colType)
		}
		var b strings.Builder
		i := 1
		for ; i < len(s); i++ {
			if s[i] == '\'' {
				if i+1 < len(s) && s[i+1] == '\'' {
					b.WriteByte('\'')
					i++
					continue
				}
				break
			}
			if s[i] == '\\' && i+1 < len(s) {
				i++
			}
			b.WriteByte(s[i])
		}
		out = append(out, b.String())
		s = strings.TrimPrefix(s[min(i+1, len(s)):], ",")
	}
	return out, nil
}

// loadIndexes reads the indexes in TiDB's order (index ID) and, as TiCDC does when the
// primary key is not among TiDB's indexes (an integer primary key that is the row's
// handle), appends an index "primary" of the primary key's columns; a table without a
// primary key gets the first NOT NULL unique index as "primary" (TiDB's GetPrimaryKey).
func (t *wireTable) loadIndexes(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, `SELECT KEY_NAME, INDEX_ID, NON_UNIQUE, IFNULL(COLUMN_NAME, '')
		FROM information_schema.TIDB_INDEXES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY INDEX_ID, SEQ_IN_INDEX`,
		t.schema, t.name)
	if err != nil {
		return fmt.Errorf("read indexes of %s.%s: %w", t.schema, t.name, err)
	}
	var handlePK *wireIndex // the primary key when it is the row handle (INDEX_ID 0)
	var idxs []*wireIndex
	byID := map[int64]*wireIndex{}
	for rows.Next() {
		var name, col string
		var id int64
		var nonUnique int
		if err := rows.Scan(&name, &id, &nonUnique, &col); err != nil {
			rows.Close()
			return fmt.Errorf("read indexes of %s.%s: %w", t.schema, t.name, err)
		}
		ix := byID[id]
		if ix == nil {
			ix = &wireIndex{name: name, unique: nonUnique == 0, primary: strings.EqualFold(name, "PRIMARY")}
			byID[id] = ix
			if id == 0 && ix.primary {
				handlePK = ix
			} else {
				idxs = append(idxs, ix)
			}
		}
		if col != "" {
			ix.columns = append(ix.columns, col)
		}
	}
	if err := rows.Close(); err != nil {
		return fmt.Errorf("read indexes of %s.%s: %w", t.schema, t.name, err)
	}
	for _, ix := range append(idxs, handlePK) {
		if ix == nil {
			continue
		}
		for _, c := range ix.columns {
			if i := t.col(c); i >= 0 && t.cols[i].nullable {
				ix.nullable = true
			}
		}
	}
	if slices.ContainsFunc(idxs, func(ix *wireIndex) bool { return ix.primary }) {
		for _, ix := range idxs {
			t.indexes = append(t.indexes, *ix)
		}
		return nil
	}
	var pk []string
	if handlePK != nil {
		pk = handlePK.columns
	} else {
		for _, ix := range idxs {
			if ix.unique && !ix.nullable && len(ix.columns) > 0 {
				pk = ix.columns
				break
			}
		}
	}
	for _, ix := range idxs {
		t.indexes = append(t.indexes, *ix)
	}
	if len(pk) > 0 {
		t.indexes = append(t.indexes, wireIndex{name: "primary", unique: true, primary: true, columns: pk})
	}
	return nil
}

func (t *wireTable) col(name string) int {
	for i, c := range t.cols {
		if strings.EqualFold(c.name, name) {
			return i
		}
	}
	return -1
}

// check reports a wire table that does not describe the same columns as meta, in order.
func (t *wireTable) check(meta *upstream.Table) error {
	if len(t.cols) != len(meta.Columns) {
		return fmt.Errorf("table %s.%s: %d columns in information_schema, %d loaded", t.schema, t.name, len(t.cols), len(meta.Columns))
	}
	for i, c := range meta.Columns {
		if !strings.EqualFold(c.Name, t.cols[i].name) {
			return fmt.Errorf("table %s.%s: column %d is %s, loaded as %s", t.schema, t.name, i, t.cols[i].name, c.Name)
		}
	}
	return nil
}

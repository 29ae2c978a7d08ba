package checker

// schema.go owns what the servers say about a table's structure: each column's kind
// (how it is encoded, ordered and compared), the table read from information_schema
// (loadTable), the key choice and the structure differences between the sides. It must
// not build the row encoding (encoding.go) nor compare rows.

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// colKind is how the checker encodes, orders and compares a column.
type colKind int

const (
	kindString   colKind = iota // char, varchar, text, enum, set: bytes, ordered by bytes in drill-down
	kindBinary                  // binary, varbinary, blob
	kindInt                     // all integer types and YEAR
	kindDecimal                 // DECIMAL/NUMERIC
	kindFloat                   // FLOAT (single precision)
	kindDouble                  // DOUBLE/REAL
	kindTemporal                // DATE, DATETIME, TIMESTAMP, TIME
	kindBit                     // BIT(n)
	kindJSON                    // JSON (MariaDB: LONGTEXT with a json_valid check)
)

// variableBytes reports whether the row encoding writes a column of kind k as its byte
// length and its bytes (strings, binaries and JSON), rather than as one short text field.
func (k colKind) variableBytes() bool {
	return k == kindString || k == kindBinary || k == kindJSON
}

func (k colKind) String() string {
	return [...]string{"string", "binary", "int", "decimal", "float", "double", "temporal", "bit", "json"}[k]
}

// schemaColumn is one column as information_schema describes it.
type schemaColumn struct {
	Name       string
	DataType   string // lower case, e.g. "varchar"
	ColumnType string // lower case, e.g. "varchar(20)", "int(10) unsigned"
	Charset    string // empty for non-text columns
	Collation  string
	Nullable   bool
	Generated  bool
	Kind       colKind
	// MaxBytes bounds the length of the column's text in the row encoding (see
	// maxTextBytes): 0 for the kinds whose text is short (numbers, temporal values, BIT).
	MaxBytes int64
}

// tableSchema is the structure of one table on one side.
type tableSchema struct {
	Schema  string
	Name    string
	Columns []schemaColumn
	// PrimaryKey lists the primary key columns; UniqueKeys every other unique index whose
	// columns are all NOT NULL.
	PrimaryKey []string
	UniqueKeys [][]string
	// Indexes lists the other (non-unique, or nullable unique) indexes' columns.
	Indexes [][]string
	// Referenced is set when a foreign key (of any table) references this table, or when
	// the server cannot tell.
	Referenced bool
}

// column returns the named column (case-insensitive, as MySQL column names are).
func (t *tableSchema) column(name string) (schemaColumn, bool) {
	for _, c := range t.Columns {
		if strings.EqualFold(c.Name, name) {
			return c, true
		}
	}
	return schemaColumn{}, false
}

func kindOf(dataType, columnType string, check bool) colKind {
	switch dataType {
	case "tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year":
		return kindInt
	case "decimal", "numeric":
		return kindDecimal
	case "float":
		return kindFloat
	case "double", "real", "double precision":
		return kindDouble
	case "date", "datetime", "timestamp", "time":
		return kindTemporal
	case "bit":
		return kindBit
	case "json":
		return kindJSON
	case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
		return kindBinary
	case "longtext":
		if check {
			return kindJSON
		}
	}
	return kindString
}

// loadTable reads the structure of schema.table through q. It returns (nil, nil) when the
// table does not exist.
func loadTable(ctx context.Context, q Querier, schema, table string) (*tableSchema, error) {
	// MariaDB stores JSON as LONGTEXT with a CHECK (json_valid(col)) constraint; find those.
	jsonCols := map[string]bool{}
	if rows, err := q.QueryContext(ctx, `SELECT CONSTRAINT_NAME, CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS
		WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?`, schema, table); err == nil {
		re := regexp.MustCompile("(?i)^json_valid\\(`?([^`)]+)`?\\)$")
		for rows.Next() {
			var name, clause string
			if err := rows.Scan(&name, &clause); err != nil {
				rows.Close()
				return nil, fmt.Errorf("read check constraints of %s.%s: %w", schema, table, err)
			}
			if m := re.FindStringSubmatch(strings.TrimSpace(clause)); m != nil {
				jsonCols[strings.ToLower(m[1])] = true
			}
		}
		rows.Close()
	} // TiDB and old servers lack the view or the TABLE_NAME column: real JSON types only.

	rows, err := q.QueryContext(ctx, `SELECT COLUMN_NAME, LOWER(DATA_TYPE), LOWER(COLUMN_TYPE),
		IFNULL(CHARACTER_SET_NAME,''), IFNULL(COLLATION_NAME,''), IS_NULLABLE, IFNULL(EXTRA,''),
		IFNULL(GENERATION_EXPRESSION,''), CHARACTER_MAXIMUM_LENGTH, CHARACTER_OCTET_LENGTH
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION`, schema, table)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
	}
	t := &tableSchema{Schema: schema, Name: table}
	for rows.Next() {
		var c schemaColumn
		var nullable, extra, gen string
		var maxChars, maxOctets sql.NullInt64
		if err := rows.Scan(&c.Name, &c.DataType, &c.ColumnType, &c.Charset, &c.Collation, &nullable, &extra, &gen, &maxChars, &maxOctets); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
		}
		c.Nullable = nullable == "YES"
		lx := strings.ToLower(extra)
		c.Generated = gen != "" || strings.Contains(lx, "generated") || strings.Contains(lx, "virtual") || strings.Contains(lx, "stored")
		c.Kind = kindOf(c.DataType, c.ColumnType, jsonCols[strings.ToLower(c.Name)])
		c.MaxBytes = maxTextBytes(c, maxChars, maxOctets)
		t.Columns = append(t.Columns, c)
	}
	if err := rows.Err(); err != nil {
		rows.Close()
		return nil, fmt.Errorf("read columns of %s.%s: %w", schema, table, err)
	}
	rows.Close()
	if len(t.Columns) == 0 {
		return nil, nil
	}

	rows, err = q.QueryContext(ctx, `SELECT INDEX_NAME, COLUMN_NAME, NON_UNIQUE, SUB_PART FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY INDEX_NAME, SEQ_IN_INDEX`, schema, table)
	if err != nil {
		return nil, fmt.Errorf("read indexes of %s.%s: %w", schema, table, err)
	}
	defer rows.Close()
	type index struct {
		name   string
		cols   []string
		unique bool
	}
	var idx []*index
	for rows.Next() {
		var name string
		var col sql.NullString
		var nonUnique int
		var subPart sql.NullInt64
		if err := rows.Scan(&name, &col, &nonUnique, &subPart); err != nil {
			return nil, fmt.Errorf("read indexes of %s.%s: %w", schema, table, err)
		}
		if len(idx) == 0 || idx[len(idx)-1].name != name {
			idx = append(idx, &index{name: name, unique: nonUnique == 0})
		}
		// A prefix index is unique on the prefix only, and an expression index has no
		// column name: neither identifies rows by whole columns.
		if subPart.Valid {
			idx[len(idx)-1].unique = false
		}
		if !col.Valid {
			idx[len(idx)-1].unique = false
			continue
		}
		idx[len(idx)-1].cols = append(idx[len(idx)-1].cols, col.String)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read indexes of %s.%s: %w", schema, table, err)
	}
	for _, ix := range idx {
		if !ix.unique {
			if len(ix.cols) > 0 {
				t.Indexes = append(t.Indexes, ix.cols)
			}
			continue
		}
		if strings.EqualFold(ix.name, "PRIMARY") {
			t.PrimaryKey = ix.cols
			continue
		}
		ok := true
		for _, name := range ix.cols {
			c, found := t.column(name)
			if !found || c.Nullable {
				ok = false
			}
		}
		if ok {
			t.UniqueKeys = append(t.UniqueKeys, ix.cols)
		} else {
			t.Indexes = append(t.Indexes, ix.cols)
		}
	}
	t.Referenced = true // unless the server says otherwise
	if rows, err := q.QueryContext(ctx, `SELECT COUNT(*) FROM information_schema.REFERENTIAL_CONSTRAINTS
		WHERE UNIQUE_CONSTRAINT_SCHEMA = ? AND REFERENCED_TABLE_NAME = ?`, schema, table); err == nil {
		var refs int
		if rows.Next() && rows.Scan(&refs) == nil && rows.Err() == nil {
			t.Referenced = refs > 0
		}
		rows.Close()
	}
	return t, nil
}

// unboundedBytes stands for a column whose values have no known maximum length (TiDB's
// JSON): longer than any max_allowed_packet, and small enough that sums never overflow.
const unboundedBytes int64 = 1 << 40

// maxTextBytes bounds the length of column c's text as the row encoding reads it, from
// information_schema's CHARACTER_MAXIMUM_LENGTH (characters) and CHARACTER_OCTET_LENGTH
// (bytes): the octet length for binary and UTF-8 columns, four bytes per character for
// other character sets (converted to utf8mb4), unboundedBytes when the server gives no
// length for a variable-length kind, and 0 for the kinds whose text is short.
func maxTextBytes(c schemaColumn, maxChars, maxOctets sql.NullInt64) int64 {
	if !c.Kind.variableBytes() {
		return 0
	}
	n := maxOctets.Int64
	if c.Kind == kindString && !isUTF8(c.Charset) && maxChars.Valid {
		n = max(n, 4*maxChars.Int64)
	}
	if !maxOctets.Valid || n <= 0 || n > unboundedBytes {
		return unboundedBytes
	}
	return n
}

// normalizedType removes what does not change stored values: integer display widths
// (MySQL 8 drops them, TiDB and MariaDB print them) and the zerofill-free spelling.
var intWidth = regexp.MustCompile(`^(tinyint|smallint|mediumint|int|bigint)\(\d+\)`)

func normalizedType(c schemaColumn) string {
	t := intWidth.ReplaceAllString(c.ColumnType, "$1")
	if c.Kind == kindJSON {
		return "json"
	}
	return t
}

// StructureProblem is one difference between the upstream and downstream structures.
type StructureProblem struct {
	Column  string `json:"column,omitempty"`
	Problem string `json:"problem"`
	// Fatal problems stop the data comparison of the table (e.g. the key is missing).
	Fatal bool `json:"fatal,omitempty"`
	// Warning marks differences that do not change stored data (collations: TiDB
	// defaults to utf8mb4_bin, MariaDB to utf8mb4_general_ci); they are listed but do not
	// make the structure unequal.
	Warning bool `json:"warning,omitempty"`
}

// structureEqual reports whether problems contains anything but warnings.
func structureEqual(problems []StructureProblem) bool {
	for _, p := range problems {
		if !p.Warning {
			return false
		}
	}
	return true
}

// compareStructure reports column and key differences between up and down, ignoring the
// ignored columns. It never fails: differences are results.
func compareStructure(up, down *tableSchema, ignored func(string) bool) []StructureProblem {
	var out []StructureProblem
	for _, uc := range up.Columns {
		if ignored(uc.Name) {
			continue
		}
		dc, ok := down.column(uc.Name)
		if !ok {
			out = append(out, StructureProblem{Column: uc.Name, Problem: "column missing downstream"})
			continue
		}
		if a, b := normalizedType(uc), normalizedType(dc); a != b {
			out = append(out, StructureProblem{Column: uc.Name, Problem: fmt.Sprintf("type differs: upstream %s, downstream %s", a, b)})
		}
		switch {
		case uc.Generated && !dc.Generated:
			out = append(out, StructureProblem{Column: uc.Name, Problem: "generated upstream, a plain column downstream: compared as data"})
		case dc.Generated && !uc.Generated:
			out = append(out, StructureProblem{Column: uc.Name, Problem: "generated downstream, a plain column upstream: not compared"})
		}
		if uc.Nullable != dc.Nullable {
			out = append(out, StructureProblem{Column: uc.Name, Problem: fmt.Sprintf("nullability differs: upstream nullable=%v, downstream nullable=%v", uc.Nullable, dc.Nullable)})
		}
		if uc.Collation != dc.Collation && uc.Kind == kindString {
			out = append(out, StructureProblem{Column: uc.Name, Problem: fmt.Sprintf("collation differs: upstream %s, downstream %s", uc.Collation, dc.Collation), Warning: true})
		}
	}
	for _, dc := range down.Columns {
		if ignored(dc.Name) {
			continue
		}
		if _, ok := up.column(dc.Name); !ok {
			out = append(out, StructureProblem{Column: dc.Name, Problem: "column missing upstream (extra downstream)"})
		}
	}
	keyName := func(k []string) string { return strings.ToLower(strings.Join(k, ",")) }
	upUK, downUK := map[string]bool{}, map[string]bool{}
	for _, k := range up.UniqueKeys {
		upUK[keyName(k)] = true
	}
	for _, k := range down.UniqueKeys {
		downUK[keyName(k)] = true
	}
	for _, k := range up.UniqueKeys {
		if !downUK[keyName(k)] {
			out = append(out, StructureProblem{Problem: fmt.Sprintf("unique key (%s) missing downstream", strings.Join(k, ","))})
		}
	}
	for _, k := range down.UniqueKeys {
		if !upUK[keyName(k)] {
			out = append(out, StructureProblem{Problem: fmt.Sprintf("unique key (%s) only downstream", strings.Join(k, ","))})
		}
	}
	if !equalFoldSlices(up.PrimaryKey, down.PrimaryKey) {
		out = append(out, StructureProblem{Problem: fmt.Sprintf("primary key differs: upstream (%s), downstream (%s)",
			strings.Join(up.PrimaryKey, ","), strings.Join(down.PrimaryKey, ","))})
	}
	return out
}

func equalFoldSlices(a, b []string) bool {
	return slices.EqualFunc(a, b, strings.EqualFold)
}

// chooseKey returns the columns that identify a row for chunking and drill-down: the
// upstream primary key, else the first NOT NULL unique key; both must exist downstream.
// keyless is true when there is none and the table is compared as a multiset of rows.
func chooseKey(up, down *tableSchema, ignored func(string) bool) (key []string, keyless bool) {
	cands := [][]string{}
	if len(up.PrimaryKey) > 0 {
		cands = append(cands, up.PrimaryKey)
	}
	cands = append(cands, up.UniqueKeys...)
	for _, k := range cands {
		ok := true
		for _, name := range k {
			uc, _ := up.column(name)
			dc, found := down.column(name)
			// JSON keys have no order both servers share: such tables are compared as
			// multisets of rows instead. FLOAT and DOUBLE keys are read as exact DOUBLE
			// text (selectExpr), which compares exactly with the column on both servers
			// (as floating-point values), so they range-cut like any number.
			if !found || ignored(name) || uc.Kind == kindJSON || uc.Kind != dc.Kind {
				ok = false
			}
		}
		if ok {
			return k, false
		}
	}
	return nil, true
}

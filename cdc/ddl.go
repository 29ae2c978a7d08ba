package cdc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/pingcap/tidb/pkg/parser"
	"github.com/pingcap/tidb/pkg/parser/ast"
	"github.com/pingcap/tidb/pkg/parser/charset"
	"github.com/pingcap/tidb/pkg/parser/format"
	"github.com/pingcap/tidb/pkg/parser/model"
	"github.com/pingcap/tidb/pkg/parser/types"

	// The parser builds literals through a driver. The full TiDB's driver pulls in all
	// of TiDB; this one, in the parser module, parses and restores every literal a DDL
	// holds (numbers, strings with their introducer, hex and bit literals, NULL).
	_ "github.com/pingcap/tidb/pkg/parser/test_driver"
)

// DDL translation. TiCDC sends a DDL as TiDB re-rendered it (TiDB's own parser and
// restorer: back-quoted names, TiDB-only syntax in /*T![feature] */ comments). parity
// parses that text with the same parser, edits the tree for the fallback and restores
// it: TiDB-only clauses and options are dropped, TiDB-only column types are mapped
// (applier.type-map), every schema a statement names is renamed (changefeed.schema-map),
// and CREATE/DROP TABLE/DATABASE get IF [NOT] EXISTS so a DDL repeated after a crash
// is harmless. Editing the tree, not the text, means a string, a comment or a column
// called `clustered` is never touched, and any syntax TiDB has is understood.

// DDL types (TiDB model.ActionType) that only change TiDB-specific state. They have no
// MySQL equivalent and are skipped (recorded as skipped, logged).
var tidbOnlyDDL = map[int]string{
	16: "shard row id bits",
	30: "TiFlash replica",
	31: "TiFlash replica status",
	39: "auto id cache",
	40: "auto random base",
	49: "table attributes",
	50: "partition attributes",
	51: "placement policy",
	52: "placement policy",
	53: "placement policy",
	54: "placement policy",
	55: "placement policy",
	56: "placement policy",
	57: "cache table",
	59: "no cache table",
	62: "flashback cluster",
	65: "TTL",
	67: "TTL",
	68: "resource group",
	69: "resource group",
	70: "resource group",
	73: "columnar index",
	74: "engine attribute",
	75: "table mode",
	76: "refresh meta",
	77: "schema read only",
}

// builtinTypeMap maps the TiDB column types MySQL 8.0 and MariaDB 10.11 lack (by the
// parser's type name) to the type the fallback gets. VECTOR is the only one in TiDB
// v8.5: MySQL 8.0 and MariaDB before 11.7 have no vector type, and MariaDB 11.7's
// VECTOR(n) takes binary values, not the text TiCDC sends. LONGTEXT is what TiCDC's
// own MySQL sink writes for it. applier.type-map adds to and overrides this map.
var builtinTypeMap = map[string]string{"vector": "LONGTEXT"}

// tidbTableOptions are table (and partition) options only TiDB has.
var tidbTableOptions = map[ast.TableOptionType]string{
	ast.TableOptionAutoIdCache:         "AUTO_ID_CACHE",
	ast.TableOptionAutoRandomBase:      "AUTO_RANDOM_BASE",
	ast.TableOptionShardRowID:          "SHARD_ROW_ID_BITS",
	ast.TableOptionPreSplitRegion:      "PRE_SPLIT_REGIONS",
	ast.TableOptionPlacementPolicy:     "PLACEMENT POLICY",
	ast.TableOptionTTL:                 "TTL",
	ast.TableOptionTTLEnable:           "TTL_ENABLE",
	ast.TableOptionTTLJobInterval:      "TTL_JOB_INTERVAL",
	ast.TableOptionStatsBuckets:        "STATS_BUCKETS",
	ast.TableOptionStatsTopN:           "STATS_TOPN",
	ast.TableOptionStatsColsChoice:     "STATS_COL_CHOICE",
	ast.TableOptionStatsColList:        "STATS_COL_LIST",
	ast.TableOptionStatsSampleRate:     "STATS_SAMPLE_RATE",
	ast.TableOptionAffinity:            "AFFINITY",
	ast.TableOptionSecondaryEngine:     "SECONDARY_ENGINE", // accepted and ignored by TiDB
	ast.TableOptionSecondaryEngineNull: "SECONDARY_ENGINE",
	// TiDB ignores these two and restores them without their value.
	ast.TableOptionStatsPersistent: "STATS_PERSISTENT",
	ast.TableOptionPackKeys:        "PACK_KEYS",
}

// tidbAlterSpecs are ALTER TABLE actions that only change TiDB-specific state.
var tidbAlterSpecs = map[ast.AlterTableType]string{
	ast.AlterTableSetTiFlashReplica:   "SET TIFLASH REPLICA",
	ast.AlterTableAttributes:          "ATTRIBUTES",
	ast.AlterTablePartitionAttributes: "PARTITION ATTRIBUTES",
	ast.AlterTablePartitionOptions:    "PARTITION PLACEMENT POLICY",
	ast.AlterTableCache:               "CACHE",
	ast.AlterTableNoCache:             "NOCACHE",
	ast.AlterTableRemoveTTL:           "REMOVE TTL",
	ast.AlterTableAddStatistics:       "ADD STATS_EXTENDED",
	ast.AlterTableDropStatistics:      "DROP STATS_EXTENDED",
	ast.AlterTableStatsOptions:        "STATS options",
	ast.AlterTableSecondaryLoad:       "SECONDARY_LOAD",
	ast.AlterTableSecondaryUnload:     "SECONDARY_UNLOAD",
}

// flavor is what a translation needs to know of the downstream server.
type flavor struct {
	// MariaDB: no INVISIBLE indexes (MariaDB has IGNORED), no [NOT] ENFORCED after a
	// CHECK; IF [NOT] EXISTS on indexes and columns.
	MariaDB bool
	// NoBackslashEscapes: the session's sql_mode has NO_BACKSLASH_ESCAPES, so a
	// backslash in a string literal is written as is.
	NoBackslashEscapes bool
}

// String names the flavour for goldens and logs.
func (f flavor) String() string {
	s := "mysql"
	if f.MariaDB {
		s = "mariadb"
	}
	if f.NoBackslashEscapes {
		s += "+no_backslash_escapes"
	}
	return s
}

// downstreamFlavor reads the flavour of the server and session behind conn.
func downstreamFlavor(ctx context.Context, conn *sql.Conn) (flavor, error) {
	var version, mode string
	if err := conn.QueryRowContext(ctx, "SELECT VERSION(), @@SESSION.sql_mode").Scan(&version, &mode); err != nil {
		return flavor{}, fmt.Errorf("reading the downstream's version: %w", err)
	}
	return flavor{
		MariaDB:            strings.Contains(strings.ToLower(version), "mariadb"),
		NoBackslashEscapes: slices.Contains(strings.Split(strings.ToUpper(mode), ","), "NO_BACKSLASH_ESCAPES"),
	}, nil
}

// mappedType is one entry of the effective type map.
type mappedType struct {
	tp   *types.FieldType
	text string // as configured, for messages
}

// ddlTranslator turns TiCDC's DDL text into statements for one downstream.
type ddlTranslator struct {
	types   map[string]mappedType // by lower-case TiDB type name
	schemas map[string]string     // changefeed.schema-map
	flavor  flavor
}

// newDDLTranslator builds a translator from the configuration (Validate has checked the
// type map; an entry that does not parse is an error here too).
func newDDLTranslator(cfg Config, fl flavor) (*ddlTranslator, error) {
	t := &ddlTranslator{types: map[string]mappedType{}, schemas: cfg.Changefeed.SchemaMap, flavor: fl}
	add := func(name, text string) error {
		tp, err := parseColumnType(text)
		if err != nil {
			return fmt.Errorf("applier.type-map.%s: %w", name, err)
		}
		t.types[strings.ToLower(name)] = mappedType{tp: tp, text: text}
		return nil
	}
	for name, text := range builtinTypeMap {
		if err := add(name, text); err != nil {
			return nil, err
		}
	}
	for name, text := range cfg.Applier.TypeMap {
		if err := add(name, text); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// ddlTranslation is a DDL as the downstream gets it.
type ddlTranslation struct {
	// SQL is the statement to execute; "" when Skip is set.
	SQL string
	// Skip says why the DDL is not executed ("" to execute it).
	Skip string
	// Parsed is false when the text is passed through as TiCDC sent it (see translate).
	Parsed bool
	// Changes lists what the translation dropped or mapped, for the log.
	Changes []string
	// Types lists the column types SQL defines (upper case, as restored), to tell a
	// rejection for an unknown type apart.
	Types []string
}

// translate turns TiCDC's DDL text into the statement for the downstream. schema is the
// event's (upstream) schema.
func (t *ddlTranslator) translate(query string, ddlType int, schema string) (ddlTranslation, error) {
	if r, ok := tidbOnlyDDL[ddlType]; ok {
		return ddlTranslation{Skip: "TiDB-only DDL: " + r}, nil
	}
	p := parser.New()
	stmt, err := p.ParseOneStmt(query, "", "")
	if err != nil {
		// TiDB's parser could not read TiDB's own rendering: a statement newer than this
		// parser version (or not one statement). Nothing is known of it, so it goes to the
		// downstream as sent, which then decides; under a schema map that could run it in
		// the upstream schema, so then it stops instead.
		if _, mapped := t.schemas[schema]; mapped {
			return ddlTranslation{}, fmt.Errorf("cannot parse the DDL to rename schema %q for changefeed.schema-map: %w", schema, err)
		}
		return ddlTranslation{SQL: query, Changes: []string{"passed through unparsed: " + err.Error()}}, nil
	}
	w := &ddlWalker{t: t}
	if skip, err := w.statement(stmt, schema); err != nil || skip != "" {
		return ddlTranslation{Skip: skip, Changes: w.changes}, err
	}
	stmt.Accept(w) // names: TableName and ColumnName anywhere in the statement

	flags := format.RestoreStringSingleQuotes | format.RestoreKeyWordUppercase | format.RestoreNameBackQuotes |
		format.RestoreStringWithoutDefaultCharset | format.SkipPlacementRuleForRestore
	if !t.flavor.NoBackslashEscapes {
		flags |= format.RestoreStringEscapeBackslash
	}
	var b strings.Builder
	if err := stmt.Restore(format.NewRestoreCtx(flags, &b)); err != nil {
		// The literal driver cannot restore every value kind; a DDL holds none of the
		// others, but should one appear the text goes through as sent (as when it does not
		// parse).
		if _, mapped := t.schemas[schema]; mapped {
			return ddlTranslation{}, fmt.Errorf("cannot restore the DDL to rename schema %q for changefeed.schema-map: %w", schema, err)
		}
		return ddlTranslation{SQL: query, Changes: []string{"passed through unrestored: " + err.Error()}}, nil
	}
	slices.Sort(w.changes)
	return ddlTranslation{SQL: b.String(), Parsed: true, Changes: slices.Compact(w.changes), Types: w.types}, nil
}

// ddlWalker edits one parsed statement.
type ddlWalker struct {
	t       *ddlTranslator
	changes []string
	types   []string
}

func (w *ddlWalker) note(format string, a ...any) {
	w.changes = append(w.changes, fmt.Sprintf(format, a...))
}

// errNoEquivalent is a DDL that changes data in a way only TiDB can (FLASHBACK, RECOVER).
var errNoEquivalent = errors.New("TiDB-only statement with no MySQL equivalent")

// statement edits stmt by its kind; skip is non-empty when nothing is left to run.
func (w *ddlWalker) statement(stmt ast.StmtNode, schema string) (skip string, err error) {
	mysqlOnly := !w.t.flavor.MariaDB
	switch s := stmt.(type) {
	case *ast.CreatePlacementPolicyStmt, *ast.AlterPlacementPolicyStmt, *ast.DropPlacementPolicyStmt:
		return "TiDB-only DDL: placement policy", nil
	case *ast.CreateResourceGroupStmt, *ast.AlterResourceGroupStmt, *ast.DropResourceGroupStmt:
		return "TiDB-only DDL: resource group", nil
	case *ast.FlashBackTableStmt, *ast.RecoverTableStmt, *ast.FlashBackDatabaseStmt, *ast.FlashBackToTimestampStmt:
		// Skipping it would leave the fallback without the data it brings back.
		return "", fmt.Errorf("%w (%T): recreate its effect on the fallback by hand, then skip it", errNoEquivalent, s)

	case *ast.CreateDatabaseStmt:
		s.IfNotExists = true
		s.Name = w.schema(s.Name)
		s.Options = w.databaseOptions(s.Options)
	case *ast.AlterDatabaseStmt:
		if s.AlterDefaultDatabase || s.Name.O == "" {
			s.Name, s.AlterDefaultDatabase = model.NewCIStr(schema), false
		}
		s.Name = w.schema(s.Name)
		if s.Options = w.databaseOptions(s.Options); len(s.Options) == 0 {
			return "only TiDB-only database options", nil
		}
	case *ast.DropDatabaseStmt:
		s.IfExists = true
		s.Name = w.schema(s.Name)

	case *ast.CreateTableStmt:
		s.IfNotExists = true
		for _, c := range s.Cols {
			w.column(c)
		}
		s.Constraints = w.constraints(s.Constraints)
		s.Options = w.tableOptions(s.Options)
		w.partitions(s.Partition)
	case *ast.DropTableStmt:
		s.IfExists = true
	case *ast.AlterTableStmt:
		var specs []*ast.AlterTableSpec
		for _, spec := range s.Specs {
			if w.alterSpec(spec) {
				specs = append(specs, spec)
			}
		}
		if len(specs) == 0 {
			return "only TiDB-only ALTER TABLE clauses: " + strings.Join(w.changes, ", "), nil
		}
		s.Specs = specs
	case *ast.CreateIndexStmt:
		if s.KeyType == ast.IndexKeyTypeVector {
			return "TiDB-only DDL: vector index", nil
		}
		w.indexOption(s.IndexOption)
		if mysqlOnly {
			s.IfNotExists = false
		}
	case *ast.DropIndexStmt:
		// A vector index was never created downstream; MariaDB can say IF EXISTS.
		s.IfExists = w.t.flavor.MariaDB
	}
	return "", nil
}

// Enter renames the schema of every qualified table and column name.
func (w *ddlWalker) Enter(n ast.Node) (ast.Node, bool) {
	switch n := n.(type) {
	case *ast.TableName:
		if n.Schema.O != "" {
			n.Schema = w.schema(n.Schema)
		}
	case *ast.ColumnName:
		if n.Schema.O != "" {
			n.Schema = w.schema(n.Schema)
		}
	}
	return n, false
}

// Leave implements ast.Visitor.
func (w *ddlWalker) Leave(n ast.Node) (ast.Node, bool) { return n, true }

func (w *ddlWalker) schema(s model.CIStr) model.CIStr {
	if to, ok := w.t.schemas[s.O]; ok {
		return model.NewCIStr(to)
	}
	return s
}

// column maps a column's type and drops TiDB-only column options.
func (w *ddlWalker) column(c *ast.ColumnDef) {
	if c.Tp != nil {
		name := types.TypeToStr(c.Tp.GetType(), c.Tp.GetCharset())
		if m, ok := w.t.types[name]; ok && !c.Tp.Equal(m.tp) {
			w.note("%s %s as %s", c.Name.Name.O, restoreType(c.Tp), m.text)
			c.Tp = m.tp.Clone()
		}
		w.types = append(w.types, strings.ToUpper(types.TypeToStr(c.Tp.GetType(), c.Tp.GetCharset())))
	}
	opts := c.Options[:0]
	for _, o := range c.Options {
		switch {
		case o.Tp == ast.ColumnOptionAutoRandom:
			w.note("AUTO_RANDOM")
			continue
		case o.Tp == ast.ColumnOptionCheck && w.t.flavor.MariaDB:
			w.note("CHECK constraint (MariaDB reads no ENFORCED)")
			continue
		case o.PrimaryKeyTp != model.PrimaryKeyTypeDefault:
			w.note("%s", o.PrimaryKeyTp)
			o.PrimaryKeyTp = model.PrimaryKeyTypeDefault
		}
		opts = append(opts, o)
	}
	c.Options = opts
}

// restoreType renders a column type for messages.
func restoreType(tp *types.FieldType) string {
	var b strings.Builder
	if err := tp.Restore(format.NewRestoreCtx(format.RestoreKeyWordUppercase, &b)); err != nil {
		return types.TypeStr(tp.GetType())
	}
	return b.String()
}

// keepConstraint drops TiDB-only indexes (and, for MariaDB, CHECK constraints, which TiDB
// writes with [NOT] ENFORCED) and cleans the options of the rest.
func (w *ddlWalker) keepConstraint(c *ast.Constraint) bool {
	switch {
	case c.Tp == ast.ConstraintVector:
		w.note("VECTOR INDEX")
		return false
	case c.Tp == ast.ConstraintCheck && w.t.flavor.MariaDB:
		w.note("CHECK constraint (MariaDB reads no ENFORCED)")
		return false
	}
	w.indexOption(c.Option)
	if !w.t.flavor.MariaDB {
		c.IfNotExists = false
	}
	return true
}

func (w *ddlWalker) constraints(cs []*ast.Constraint) []*ast.Constraint {
	out := cs[:0]
	for _, c := range cs {
		if w.keepConstraint(c) {
			out = append(out, c)
		}
	}
	return out
}

// indexOption drops TiDB-only index options.
func (w *ddlWalker) indexOption(o *ast.IndexOption) {
	if o == nil {
		return
	}
	if o.PrimaryKeyTp != model.PrimaryKeyTypeDefault {
		w.note("%s", o.PrimaryKeyTp)
		o.PrimaryKeyTp = model.PrimaryKeyTypeDefault
	}
	if o.Global {
		w.note("GLOBAL index")
		o.Global = false
	}
	if o.Tp == model.IndexTypeHypo || o.Tp == model.IndexTypeHNSW {
		w.note("USING %s", o.Tp)
		o.Tp = model.IndexTypeInvalid
	}
	if o.Visibility != ast.IndexVisibilityDefault && w.t.flavor.MariaDB {
		w.note("index visibility (MariaDB has IGNORED indexes instead)")
		o.Visibility = ast.IndexVisibilityDefault
	}
}

func (w *ddlWalker) tableOptions(opts []*ast.TableOption) []*ast.TableOption {
	out := opts[:0]
	for _, o := range opts {
		if name, ok := tidbTableOptions[o.Tp]; ok {
			w.note("%s", name)
			continue
		}
		if o.Tp == ast.TableOptionRowFormat && o.UintValue >= ast.TokuDBRowFormatDefault {
			w.note("ROW_FORMAT=TOKUDB_*")
			continue
		}
		out = append(out, o)
	}
	return out
}

func (w *ddlWalker) databaseOptions(opts []*ast.DatabaseOption) []*ast.DatabaseOption {
	out := opts[:0]
	for _, o := range opts {
		switch o.Tp {
		case ast.DatabaseOptionPlacementPolicy:
			w.note("PLACEMENT POLICY")
			continue
		case ast.DatabaseSetTiFlashReplica:
			w.note("SET TIFLASH REPLICA")
			continue
		}
		out = append(out, o)
	}
	return out
}

func (w *ddlWalker) partitions(p *ast.PartitionOptions) {
	if p == nil {
		return
	}
	w.partitionDefs(p.Definitions)
}

func (w *ddlWalker) partitionDefs(defs []*ast.PartitionDefinition) {
	for _, d := range defs {
		d.Options = w.tableOptions(d.Options)
	}
}

// alterSpec edits one ALTER TABLE clause; false drops it.
func (w *ddlWalker) alterSpec(s *ast.AlterTableSpec) bool {
	if name, ok := tidbAlterSpecs[s.Tp]; ok {
		w.note("%s", name)
		return false
	}
	mariaDB := w.t.flavor.MariaDB
	switch s.Tp {
	case ast.AlterTableOption:
		if s.Options = w.tableOptions(s.Options); len(s.Options) == 0 {
			return false
		}
	case ast.AlterTableAddConstraint:
		if s.Constraint != nil && !w.keepConstraint(s.Constraint) {
			return false
		}
	case ast.AlterTableIndexInvisible, ast.AlterTableDropCheck, ast.AlterTableAlterCheck:
		if mariaDB {
			w.note("%s", map[ast.AlterTableType]string{
				ast.AlterTableIndexInvisible: "ALTER INDEX visibility (MariaDB has IGNORED indexes instead)",
				ast.AlterTableDropCheck:      "DROP CHECK (CHECK constraints are not created on MariaDB)",
				ast.AlterTableAlterCheck:     "ALTER CHECK (CHECK constraints are not created on MariaDB)",
			}[s.Tp])
			return false
		}
	case ast.AlterTableDropIndex:
		// A vector index was never created downstream; MariaDB can say IF EXISTS.
		if mariaDB {
			s.IfExists = true
		}
	}
	for _, c := range s.NewColumns {
		w.column(c)
	}
	s.NewConstraints = w.constraints(s.NewConstraints)
	w.partitionDefs(s.PartDefinitions)
	w.partitions(s.Partition)
	if !mariaDB {
		// IF [NOT] EXISTS on columns, indexes and partitions is MariaDB's (and TiDB's).
		s.IfExists, s.IfNotExists = false, false
	}
	return true
}

// tidbTypeNames are the names a column type is known by in applier.type-map: the
// parser's names, with the binary variants of strings (varbinary, blob, ...).
var tidbTypeNames = func() map[string]bool {
	m := map[string]bool{}
	for tp := range 256 {
		for _, cs := range []string{"", charset.CharsetBin} {
			switch s := types.TypeToStr(byte(tp), cs); s {
			case "", "unspecified", "null", "var_string", "geometry":
			default:
				m[s] = true
			}
		}
	}
	return m
}()

func knownTypeName(name string) bool { return tidbTypeNames[strings.ToLower(name)] }

func typeNames() []string {
	var names []string
	for n := range tidbTypeNames {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// parseColumnType parses a column type as MySQL writes it ("LONGTEXT", "VARCHAR(100)").
func parseColumnType(text string) (*types.FieldType, error) {
	if strings.TrimSpace(text) == "" {
		return nil, errors.New("empty column type")
	}
	stmt, err := parser.New().ParseOneStmt("CREATE TABLE t (c "+text+")", "", "")
	if err != nil {
		return nil, fmt.Errorf("%q is not a column type: %w", text, err)
	}
	ct, ok := stmt.(*ast.CreateTableStmt)
	if !ok || len(ct.Cols) != 1 || len(ct.Cols[0].Options) > 0 || len(ct.Constraints) > 0 || len(ct.Options) > 0 || ct.Partition != nil {
		return nil, fmt.Errorf("%q is not a column type alone", text)
	}
	return ct.Cols[0].Tp, nil
}

// unknownTypeRe finds the type MariaDB names in error 4161 ("Unknown data type: 'VECTOR'").
var unknownTypeRe = regexp.MustCompile(`(?i)unknown data type: '([^']+)'`)

// nearRe finds where MySQL's syntax error (1064) stopped reading.
var nearRe = regexp.MustCompile(`near '([A-Za-z_]+)`)

// rejectHint says which setting gets past a DDL the downstream rejected: a type-map
// entry when an unknown column type is what it rejected, and always skip-ddl by commit
// ts.
func rejectHint(err error, commitTs uint64, tr ddlTranslation) string {
	skip := fmt.Sprintf("skip it with [[applier.skip-ddl]] commit-ts = %d (then apply its effect by hand)", commitTs)
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return skip
	}
	var typ string
	switch me.Number {
	case 4161: // MariaDB: unknown data type
		if m := unknownTypeRe.FindStringSubmatch(me.Message); m != nil {
			typ = m[1]
		}
	case 1064: // syntax error: at a column type this statement defines?
		if m := nearRe.FindStringSubmatch(me.Message); m != nil && slices.Contains(tr.Types, strings.ToUpper(m[1])) {
			typ = m[1]
		}
	}
	if typ == "" || !knownTypeName(typ) {
		return skip
	}
	return fmt.Sprintf("map the type with applier.type-map = { %s = \"LONGTEXT\" } (or another type the fallback has), or %s",
		strings.ToLower(typ), skip)
}

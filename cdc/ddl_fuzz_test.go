package cdc

import (
	"maps"
	"slices"
	"testing"

	"github.com/pingcap/tidb/pkg/parser"
	"github.com/pingcap/tidb/pkg/parser/ast"
	"github.com/pingcap/tidb/pkg/parser/mysql"
)

// fuzzSchemaMap is FuzzDDLRewrite's changefeed.schema-map: the corpora's schemas and
// names that need quoting, mapped to names that are not keys (so a key left in a
// translation is a rename that was missed).
var fuzzSchemaMap = map[string]string{
	"app": "app_fb", "corpus": "corpus_fb", "corpus_tmp": "corpus_tmp_fb", "rnd": "rnd_fb",
	"we`ird db": "we`ird_fb", "select": "select fb", "ünï😀": "uni_fb",
}

// FuzzDDLRewrite feeds arbitrary SQL (seeded with every DDL of the shared TiCDC corpora
// and the hand-written translate cases) to the changefeed's DDL translation, with a
// schema map and a type map, for MariaDB and MySQL, with and without
// NO_BACKSLASH_ESCAPES. It must never panic; a translation that parsed must restore to
// one statement the parser reads back (in the downstream's sql_mode), in which no
// mapped schema is left unrenamed; a text that did not parse is passed through as sent
// only when its schema is not mapped.
func FuzzDDLRewrite(f *testing.F) {
	seen := map[string]bool{}
	for _, set := range corpusDDLs(f) {
		for _, d := range set {
			if !seen[d.query] {
				seen[d.query] = true
				f.Add(d.query, d.typ, d.schema, uint8(0))
			}
		}
	}
	for _, c := range translateCases {
		f.Add(c.in, c.typ, c.schema, uint8(1))
	}
	f.Add("CREATE TABLE `we``ird db`.`ta'b\"le.x y` (`sel``ect` INT PRIMARY KEY, `😀 col` VARCHAR(10) DEFAULT 'a''b\\\\c')", 3, "we`ird db", uint8(2))
	f.Add("ALTER TABLE `select`.`from` ADD COLUMN `where` INT, RENAME TO `ünï😀`.`t`", 5, "select", uint8(3))
	f.Add("CREATE DATABASE `ünï😀`", 1, "ünï😀", uint8(0))
	f.Add("ALTER DATABASE CHARACTER SET = utf8mb4", 15, "select", uint8(1))

	cfg := DefaultConfig()
	cfg.Changefeed.SchemaMap = fuzzSchemaMap
	cfg.Applier.TypeMap = map[string]string{"json": "LONGTEXT", "bit": "BIGINT UNSIGNED"}
	translators := map[flavor]*ddlTranslator{}
	for _, fl := range []flavor{{}, {MariaDB: true}, {NoBackslashEscapes: true}, {MariaDB: true, NoBackslashEscapes: true}} {
		tr, err := newDDLTranslator(cfg, fl)
		if err != nil {
			f.Fatal(err)
		}
		translators[fl] = tr
	}
	f.Fuzz(func(t *testing.T, query string, ddlType int, schema string, fl uint8) {
		flv := flavor{MariaDB: fl&1 != 0, NoBackslashEscapes: fl&2 != 0}
		got, err := translators[flv].translate(query, ddlType, schema)
		if err != nil || got.Skip != "" {
			return
		}
		if !got.Parsed {
			if got.SQL != query {
				t.Fatalf("passed through %q as %q", query, got.SQL)
			}
			if _, mapped := fuzzSchemaMap[schema]; mapped {
				t.Fatalf("%q passed through unparsed under a schema map (schema %q)", query, schema)
			}
			return
		}
		p := parser.New()
		if flv.NoBackslashEscapes {
			p.SetSQLMode(mysql.ModeNoBackslashEscapes)
		}
		stmt, err := p.ParseOneStmt(got.SQL, "", "")
		if err != nil {
			t.Fatalf("%s (%s): the translation does not parse back: %v\n  in:  %q\n  out: %q", flv, schema, err, query, got.SQL)
		}
		if left := unmappedSchemas(stmt, schema); len(left) > 0 {
			t.Fatalf("%s: schema(s) %q left unrenamed\n  in:  %q\n  out: %q", flv, left, query, got.SQL)
		}
	})
}

// unmappedSchemas returns the schema names in stmt that fuzzSchemaMap maps (a rename the
// translation missed): of qualified table and column names and database statements.
func unmappedSchemas(stmt ast.StmtNode, schema string) []string {
	v := &schemaCollector{}
	stmt.Accept(v)
	switch s := stmt.(type) {
	case *ast.CreateDatabaseStmt:
		v.names = append(v.names, s.Name.O)
	case *ast.DropDatabaseStmt:
		v.names = append(v.names, s.Name.O)
	case *ast.AlterDatabaseStmt:
		name := s.Name.O
		if s.AlterDefaultDatabase || name == "" {
			name = schema // the event's schema: must have been filled in and renamed
		}
		v.names = append(v.names, name)
	}
	var left []string
	for _, n := range v.names {
		if _, ok := fuzzSchemaMap[n]; ok && !slices.Contains(slices.Collect(maps.Values(fuzzSchemaMap)), n) {
			left = append(left, n)
		}
	}
	return left
}

type schemaCollector struct{ names []string }

func (c *schemaCollector) Enter(n ast.Node) (ast.Node, bool) {
	switch n := n.(type) {
	case *ast.TableName:
		c.names = append(c.names, n.Schema.O)
	case *ast.ColumnName:
		c.names = append(c.names, n.Schema.O)
	}
	return n, false
}

func (c *schemaCollector) Leave(n ast.Node) (ast.Node, bool) { return n, true }

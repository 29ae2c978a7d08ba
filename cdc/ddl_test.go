package cdc

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/corpus"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/metaschema"
	"github.com/tidb-parity/parity/internal/testenv"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/")

// goldenFile compares got with testdata/name (or rewrites it with -update).
func goldenFile(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if string(want) != got {
		wl, gl := strings.Split(string(want), "\n"), strings.Split(got, "\n")
		for i := range max(len(wl), len(gl)) {
			var w, g string
			if i < len(wl) {
				w = wl[i]
			}
			if i < len(gl) {
				g = gl[i]
			}
			if w != g {
				t.Fatalf("%s differs at line %d:\nwant %s\ngot  %s\n(run with -update to accept)", path, i+1, w, g)
			}
		}
	}
}

func mustTranslator(t *testing.T, cfg Config, fl flavor) *ddlTranslator {
	t.Helper()
	tr, err := newDDLTranslator(cfg, fl)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// render is one translation as the goldens show it.
func render(tr ddlTranslation, err error) string {
	switch {
	case err != nil:
		return "error: " + err.Error()
	case tr.Skip != "":
		return "skip: " + tr.Skip
	}
	s := tr.SQL
	if !tr.Parsed {
		s = "(unparsed) " + s
	}
	if len(tr.Changes) > 0 {
		s += "\n   changes: " + strings.Join(tr.Changes, "; ")
	}
	return s
}

// translateCases are hand-written TiDB DDLs: TiDB-only syntax bare and in comments,
// types to map, names to rename, statements to skip.
var translateCases = []struct {
	name, in string
	typ      int
	schema   string
}{
	{"plain", "ALTER TABLE `t` ADD COLUMN `c` INT", 5, "app"},
	{"tidb comments", "CREATE TABLE `t` (`id` BIGINT /*T![auto_rand] AUTO_RANDOM(5) */ PRIMARY KEY /*T![clustered_index] CLUSTERED */)", 3, "app"},
	{"bare tidb clauses", "CREATE TABLE `t` (`id` BIGINT AUTO_RANDOM(5, 54), PRIMARY KEY (`id`) NONCLUSTERED) SHARD_ROW_ID_BITS = 4 PRE_SPLIT_REGIONS=2 AUTO_ID_CACHE 100 AUTO_RANDOM_BASE = 1000", 3, "app"},
	{"placement and ttl", "CREATE TABLE `t` (`c` DATETIME) PLACEMENT POLICY = `p1` TTL = `c` + INTERVAL 1 DAY TTL_ENABLE = 'OFF' TTL_JOB_INTERVAL = '1h'", 3, "app"},
	{"stats options", "CREATE TABLE `t` (`c` INT) STATS_BUCKETS = 100 STATS_TOPN = 10 STATS_SAMPLE_RATE = 0.5 STATS_COL_CHOICE = 'list' STATS_COL_LIST = 'c' STATS_PERSISTENT = 1", 3, "app"},
	{"literals untouched", "ALTER TABLE `clustered` COMMENT = 'AUTO_RANDOM(5) CLUSTERED /*T! x */'", 17, "app"},
	{"string escapes", "ALTER TABLE `t` ADD COLUMN `c` VARCHAR(10) DEFAULT 'it''s \\\\ here' COMMENT 'two\nlines'", 5, "app"},
	{"vector column", "CREATE TABLE `app`.`v` (`id` INT PRIMARY KEY, `e` VECTOR(3) NOT NULL COMMENT 'emb', `f` VECTOR, VECTOR INDEX `vi`((VEC_COSINE_DISTANCE(`e`))) USING HNSW)", 3, "app"},
	{"vector add column", "ALTER TABLE `app`.`v` ADD COLUMN `g` VECTOR(8) NULL", 5, "app"},
	{"vector index ddl", "CREATE VECTOR INDEX `vi` ON `app`.`v` ((VEC_L2_DISTANCE(`e`))) USING HNSW", 7, "app"},
	{"vector index alter", "ALTER TABLE `app`.`v` ADD VECTOR INDEX `vi`((VEC_L2_DISTANCE(`e`))) USING HNSW", 7, "app"},
	{"alter only tidb", "ALTER TABLE `app`.`t` SHARD_ROW_ID_BITS = 4, PLACEMENT POLICY = `p`", 5, "app"},
	{"alter mixed", "ALTER TABLE `app`.`t` ADD COLUMN `x` INT, AUTO_ID_CACHE = 10, CACHE", 5, "app"},
	{"global index", "CREATE TABLE `t` (`a` INT, `b` INT, UNIQUE KEY `u`(`b`) GLOBAL) PARTITION BY HASH (`a`) PARTITIONS 4", 3, "app"},
	{"partition placement", "CREATE TABLE `t` (`a` INT) PARTITION BY RANGE (`a`) (PARTITION `p0` VALUES LESS THAN (10) PLACEMENT POLICY = `p1`, PARTITION `p1` VALUES LESS THAN (MAXVALUE))", 3, "app"},
	{"invisible index", "CREATE TABLE `t` (`a` INT, INDEX `i`(`a`) INVISIBLE)", 3, "app"},
	{"alter index visibility", "ALTER TABLE `t` ALTER INDEX `i` INVISIBLE", 58, "app"},
	{"check constraints", "CREATE TABLE `t` (`a` INT CHECK (`a` > 0), `b` INT, CONSTRAINT `c1` CHECK (`b` < 10) NOT ENFORCED)", 3, "app"},
	{"if exists on indexes", "ALTER TABLE `t` ADD INDEX IF NOT EXISTS `i`(`a`), DROP COLUMN IF EXISTS `z`", 5, "app"},
	{"create index if not exists", "CREATE INDEX IF NOT EXISTS `i` ON `app`.`t` (`a`)", 7, "app"},
	{"drop index", "DROP INDEX `i` ON `app`.`t`", 8, "app"},
	{"tiflash replica", "ALTER TABLE `t` SET TIFLASH REPLICA 1", 30, "app"},
	{"placement policy ddl", "CREATE PLACEMENT POLICY p1 PRIMARY_REGION=\"r1\" REGIONS=\"r1\"", 51, "app"},
	{"resource group by text", "/* x */ CREATE RESOURCE GROUP rg1 RU_PER_SEC = 100", 0, "app"},
	{"recover table", "RECOVER TABLE `app`.`t`", 0, "app"},
	{"create database", "CREATE DATABASE `app` /*T![placement] PLACEMENT POLICY = `p` */", 1, "app"},
	{"alter database", "ALTER DATABASE `app` CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin", 15, "app"},
	{"alter database placement only", "ALTER DATABASE `app` PLACEMENT POLICY = `p`", 15, "app"},
	{"drop database", "DROP DATABASE `app`", 2, "app"},
	{"drop table", "DROP TABLE `app`.`t`", 4, "app"},
	{"drop view", "DROP VIEW `app`.`w`", 24, "app"},
	{"already idempotent", "create table if not exists t (a int)", 3, "app"},
	{"truncate", "TRUNCATE TABLE `app`.`t`", 11, "app"},
	{"rename across schemas", "RENAME TABLE `app`.`a` TO `other`.`b`", 14, "app"},
	{"rename unqualified", "RENAME TABLE `a` TO `b`", 14, "app"},
	{"alter rename", "ALTER TABLE `app`.`a` RENAME TO `app`.`b`", 14, "app"},
	{"create like", "CREATE TABLE `app`.`t2` LIKE `app`.`t`", 3, "app"},
	{"foreign key", "CREATE TABLE `app`.`c` (`id` INT PRIMARY KEY, `p` INT, CONSTRAINT `fk` FOREIGN KEY (`p`) REFERENCES `app`.`p`(`id`) ON DELETE CASCADE, `q` INT REFERENCES `other`.`q`(`id`))", 3, "app"},
	{"alter add foreign key", "ALTER TABLE `app`.`c` ADD CONSTRAINT `fk2` FOREIGN KEY (`p`) REFERENCES `app`.`p`(`id`)", 5, "app"},
	{"create view", "CREATE ALGORITHM = UNDEFINED DEFINER = `root`@`%` SQL SECURITY DEFINER VIEW `app`.`w` AS SELECT `app`.`t`.`a` AS `a` FROM `app`.`t` JOIN `other`.`u` ON `app`.`t`.`a` = `other`.`u`.`a`", 21, "app"},
	{"defaults and generated", "CREATE TABLE `t` (`a` INT DEFAULT 1, `b` DOUBLE DEFAULT 1.5e3, `c` DECIMAL(5,2) DEFAULT 1.25, `d` BIT(8) DEFAULT b'101', `e` VARBINARY(3) DEFAULT x'ab', `f` DATETIME(6) DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), `g` JSON DEFAULT (JSON_ARRAY()), `h` INT AS (`a` + 1) VIRTUAL, `i` VARCHAR(4) CHARACTER SET latin1 COLLATE latin1_bin DEFAULT _latin1'x', `j` ENUM('a\\\\b','c''d'))", 3, "app"},
	{"unparsable", "ALTER TABLE `t` FROBNICATE", 5, "other"},
	{"unparsable under a schema map", "ALTER TABLE `t` FROBNICATE", 5, "app"},
}

// TestTranslateDDL: the hand-written cases translated for MariaDB and MySQL, and under a
// schema map (app → app_fb), against testdata/ddl/translate.golden.
func TestTranslateDDL(t *testing.T) {
	var b strings.Builder
	for _, v := range []struct {
		label string
		fl    flavor
		smap  map[string]string
	}{
		{"mariadb", flavor{MariaDB: true}, nil},
		{"mysql", flavor{}, nil},
		{"mariadb, schema-map app=app_fb", flavor{MariaDB: true}, map[string]string{"app": "app_fb"}},
		{"mysql, no_backslash_escapes, schema-map app=app_fb", flavor{NoBackslashEscapes: true}, map[string]string{"app": "app_fb"}},
	} {
		cfg := DefaultConfig()
		cfg.Changefeed.SchemaMap = v.smap
		tr := mustTranslator(t, cfg, v.fl)
		fmt.Fprintf(&b, "######## %s\n", v.label)
		for _, c := range translateCases {
			got, err := tr.translate(c.in, c.typ, c.schema)
			fmt.Fprintf(&b, "== %s\n%s\n-> %s\n", c.name, c.in, render(got, err))
		}
	}
	goldenFile(t, "ddl/translate.golden", b.String())
}

// TestTranslateIdempotent: CREATE/DROP TABLE/DATABASE repeat harmlessly.
func TestTranslateIdempotent(t *testing.T) {
	tr := mustTranslator(t, DefaultConfig(), flavor{MariaDB: true})
	for in, want := range map[string]string{
		"CREATE TABLE `t` (a INT)":             "CREATE TABLE IF NOT EXISTS `t` (`a` INT)",
		"create table if not exists t (a int)": "CREATE TABLE IF NOT EXISTS `t` (`a` INT)",
		"DROP TABLE `t`":                       "DROP TABLE IF EXISTS `t`",
		"CREATE DATABASE `d`":                  "CREATE DATABASE IF NOT EXISTS `d`",
		"DROP SCHEMA d":                        "DROP DATABASE IF EXISTS `d`",
		"ALTER TABLE t ADD COLUMN c INT":       "ALTER TABLE `t` ADD COLUMN `c` INT",
	} {
		got, err := tr.translate(in, 0, "")
		if err != nil || got.SQL != want {
			t.Errorf("translate(%q) = %q, %v; want %q", in, got.SQL, err, want)
		}
	}
}

// TestTranslateTypeMap: applier.type-map overrides the built-in VECTOR mapping and adds
// types; a type mapped to itself stays.
func TestTranslateTypeMap(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Applier.TypeMap = map[string]string{"Vector": "VARCHAR(4000)", "json": "LONGTEXT"}
	tr := mustTranslator(t, cfg, flavor{MariaDB: true})
	got, err := tr.translate("CREATE TABLE `t` (`v` VECTOR(3), `j` JSON NOT NULL, `l` LONGTEXT)", 3, "")
	want := "CREATE TABLE IF NOT EXISTS `t` (`v` VARCHAR(4000),`j` LONGTEXT NOT NULL,`l` LONGTEXT)"
	if err != nil || got.SQL != want {
		t.Fatalf("got %q, %v; want %q", got.SQL, err, want)
	}
	if !slices.Equal(got.Types, []string{"VARCHAR", "LONGTEXT", "LONGTEXT"}) {
		t.Errorf("types %q", got.Types)
	}
	cfg.Applier.TypeMap = map[string]string{"vector": "vector"}
	got, err = mustTranslator(t, cfg, flavor{}).translate("ALTER TABLE `t` ADD COLUMN `v` VECTOR", 5, "")
	if err != nil || got.SQL != "ALTER TABLE `t` ADD COLUMN `v` VECTOR" {
		t.Fatalf("identity map: %q, %v", got.SQL, err)
	}
}

// corpusDDL is one DDL event of the shared TiCDC corpora.
type corpusDDL struct {
	source   string // corpus case, or random changefeed
	commitTs uint64
	schema   string
	table    string
	typ      int
	query    string
}

// randomDDLTypes maps the type names of ticdc-random's meta.json to TiDB action types.
var randomDDLTypes = map[string]int{"create schema": 1, "drop schema": 2, "create table": 3, "drop table": 4,
	"add column": 5, "drop column": 6, "add index": 7, "drop index": 8, "truncate table": 11, "rename table": 14}

// corpusDDLs returns the DDL events of ../shared/ticdc-corpus (set "corpus", in commit-ts
// order, classic and new architecture) and of each ../shared/ticdc-random changefeed.
func corpusDDLs(t testing.TB) map[string][]corpusDDL {
	t.Helper()
	dir := corpus.Dir(t)
	sets := map[string][]corpusDDL{}
	cases, err := filepath.Glob(filepath.Join(dir, "*", "expected.json"))
	if err != nil || len(cases) == 0 {
		t.Fatalf("corpus cases: %v (%d)", err, len(cases))
	}
	for _, path := range cases {
		var exp struct {
			Messages []struct {
				Events []struct {
					Kind     string `json:"kind"`
					CommitTs uint64 `json:"commit_ts"`
					Schema   string `json:"schema"`
					Table    string `json:"table"`
					DDLType  int    `json:"ddl_type"`
					Query    string `json:"query"`
				} `json:"events"`
			} `json:"messages"`
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &exp); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		for _, m := range exp.Messages {
			for _, e := range m.Events {
				if e.Kind == "ddl" {
					sets["corpus"] = append(sets["corpus"], corpusDDL{filepath.Base(filepath.Dir(path)), e.CommitTs, e.Schema, e.Table, e.DDLType, e.Query})
				}
			}
		}
	}
	metas, err := filepath.Glob(filepath.Join(dir, "..", "ticdc-random", "*", "meta.json"))
	if err != nil || len(metas) == 0 {
		t.Fatalf("ticdc-random changefeeds: %v (%d)", err, len(metas))
	}
	for _, path := range metas {
		var meta struct {
			DDL []struct {
				CommitTs uint64 `json:"commit_ts"`
				Type     string `json:"type"`
				Schema   string `json:"schema"`
				Table    string `json:"table"`
				Query    string `json:"query"`
			} `json:"ddl_events"`
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &meta); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		set := "random/" + filepath.Base(filepath.Dir(path))
		for _, e := range meta.DDL {
			typ, ok := randomDDLTypes[e.Type]
			if !ok {
				t.Fatalf("%s: DDL type %q unknown to the test", path, e.Type)
			}
			sets[set] = append(sets[set], corpusDDL{set, e.CommitTs, e.Schema, e.Table, typ, e.Query})
		}
	}
	for _, s := range sets {
		slices.SortStableFunc(s, func(a, b corpusDDL) int {
			switch {
			case a.commitTs < b.commitTs:
				return -1
			case a.commitTs > b.commitTs:
				return 1
			}
			return 0
		})
	}
	return sets
}

// TestTranslateCorpusDDL: every DDL TiCDC encoded in the shared corpora, translated for
// MariaDB with and without a schema map, against testdata/ddl/corpus.golden.
func TestTranslateCorpusDDL(t *testing.T) {
	sets := corpusDDLs(t)
	var b strings.Builder
	for _, smap := range []map[string]string{nil, {"corpus": "corpus_fb", "corpus_tmp": "corpus_tmp_fb", "rnd": "rnd_fb"}} {
		cfg := DefaultConfig()
		cfg.Changefeed.SchemaMap = smap
		tr := mustTranslator(t, cfg, flavor{MariaDB: true})
		fmt.Fprintf(&b, "######## mariadb, schema-map %v\n", smap)
		seen := map[string]bool{}
		for _, name := range slices.Sorted(func(yield func(string) bool) {
			for k := range sets {
				if !yield(k) {
					return
				}
			}
		}) {
			for _, d := range sets[name] {
				if seen[d.query] {
					continue
				}
				seen[d.query] = true
				got, err := tr.translate(d.query, d.typ, d.schema)
				if err != nil || got.Skip != "" || !got.Parsed {
					t.Errorf("%s: %q: %s", d.source, d.query, render(got, err))
				}
				fmt.Fprintf(&b, "== %s (ts %d)\n%s\n-> %s\n", d.source, d.commitTs, d.query, render(got, err))
			}
		}
	}
	goldenFile(t, "ddl/corpus.golden", b.String())
}

// TestCorpusDDLOnFallback runs every DDL of the shared corpora, translated as execDDL
// translates it, on the real fallback MariaDB, each set in commit-ts order in fresh
// databases: the corpora's schemas (corpus, corpus_tmp, rnd) are mapped to new names
// with changefeed.schema-map, unqualified names run under USE of the mapped schema. The
// tables must land in the mapped schemas with the shape the DDLs give them, and no
// statement may name an upstream schema.
func TestCorpusDDLOnFallback(t *testing.T) {
	down := testenv.Downstream(t)
	sets := corpusDDLs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := down.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fl, err := downstreamFlavor(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if !fl.MariaDB {
		t.Fatalf("the fallback of the test environment is not MariaDB: %v", fl)
	}

	ran := map[string]bool{} // distinct query texts run
	mapped := map[string]map[string]string{}
	// Every set: the corpus, then each of ../shared/ticdc-random's changefeeds (whatever
	// their protocol: a DDL's text is TiCDC's in each).
	names := slices.Sorted(maps.Keys(sets))
	for _, name := range names {
		ddls := sets[name]
		if len(ddls) == 0 {
			t.Fatalf("no DDLs in %s", name)
		}
		smap := map[string]string{}
		for _, up := range []string{"corpus", "corpus_tmp", "rnd"} {
			smap[up] = testenv.UniqueName("pd")
			db := smap[up]
			t.Cleanup(func() {
				if os.Getenv("PARITY_TEST_KEEP") != "1" {
					_, _ = down.Exec("DROP DATABASE IF EXISTS " + ident.Quote(db))
				}
			})
		}
		mapped[name] = smap
		cfg := DefaultConfig()
		cfg.Changefeed.SchemaMap = smap
		tr := mustTranslator(t, cfg, fl)
		done := map[string]bool{}
		for _, d := range ddls {
			key := fmt.Sprint(d.commitTs, d.query)
			if name == "corpus" {
				// The compression cases repeat ddl-03's event, and the new architecture's
				// cases the classic ones' statements (at other commit ts).
				key = d.query
			}
			if done[key] {
				continue
			}
			done[key] = true
			got, err := tr.translate(d.query, d.typ, d.schema)
			if err != nil || got.SQL == "" {
				t.Fatalf("%s: %q: %s", d.source, d.query, render(got, err))
			}
			for up := range smap {
				if strings.Contains(got.SQL, "`"+up+"`") {
					t.Errorf("%s: %q still names schema %s", d.source, got.SQL, up)
				}
			}
			if d.table != "" { // as execDDL does
				if _, err := conn.ExecContext(ctx, "USE "+ident.Quote(cfg.targetSchema(d.schema))); err != nil {
					t.Fatalf("%s: USE: %v", d.source, err)
				}
			}
			if _, err := conn.ExecContext(ctx, got.SQL); err != nil {
				t.Fatalf("%s (ts %d): %q executed as %q: %v", d.source, d.commitTs, d.query, got.SQL, err)
			}
			ran[d.query] = true
		}
	}
	for _, ddls := range sets {
		for _, d := range ddls {
			if !ran[d.query] {
				t.Errorf("%s: %q never ran", d.source, d.query)
			}
		}
	}

	// The corpus's tables, as its DDLs leave them, in the mapped schema.
	columnType := func(schema, table, column string) string {
		var typ string
		if err := conn.QueryRowContext(ctx, "SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=? AND TABLE_NAME=? AND COLUMN_NAME=?",
			schema, table, column).Scan(&typ); err != nil {
			t.Errorf("%s.%s.%s: %v", schema, table, column, err)
		}
		return typ
	}
	tables := func(schema string) []string {
		rows, err := conn.QueryContext(ctx, "SELECT TABLE_NAME FROM information_schema.TABLES WHERE TABLE_SCHEMA=? ORDER BY TABLE_NAME", schema)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []string
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			out = append(out, n)
		}
		return out
	}
	c := mapped["corpus"]["corpus"]
	equal(t, "corpus tables", tables(c), []string{"all_types", "batch_t", "composite_pk", "gen_cols2", "no_key", "part_t2", "uk_only"})
	if typ := columnType(c, "all_types", "c_vector"); typ != "longtext" {
		t.Errorf("all_types.c_vector is %s, want longtext", typ)
	}
	if typ := columnType(c, "uk_only", "added_col"); typ != "varchar" {
		t.Errorf("uk_only.added_col is %s, want varchar", typ)
	}
	var n int
	if err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA=? AND TABLE_NAME='batch_t' AND INDEX_NAME='idx_v'", c).Scan(&n); err != nil || n != 1 {
		t.Errorf("batch_t.idx_v: %d, %v", n, err)
	}
	r := mapped["random/index-value"]["rnd"]
	equal(t, "random/index-value tables", tables(r), []string{"t_bigint_nc_r8", "t_comp", "t_int_r7", "t_nokey", "t_types", "t_uk", "t_uk_nn", "t_vc_bin", "t_vc_ci_r6"})
	if typ := columnType(r, "t_bigint_nc_r8", "x5_m"); typ != "decimal" {
		t.Errorf("t_bigint_nc_r8.x5_m is %s, want decimal", typ)
	}
}

// TestConfigTypeMapAndSkipDDL: the new applier keys are validated with their key paths.
func TestConfigTypeMapAndSkipDDL(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Changefeed.Brokers = []string{"k:9092"}
	cfg.Changefeed.Topics = []string{"t"}
	cfg.Downstream.DSN = "root@tcp(127.0.0.1:3306)/"
	cfg.Applier.TypeMap = map[string]string{"vector": "MEDIUMTEXT", "json": "TEXT"}
	cfg.Applier.SkipDDL = []SkipDDL{{CommitTs: 5}, {Pattern: `(?i)^ALTER TABLE`}, {CommitTs: 7, Pattern: "x"}}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	cfg.Applier.TypeMap = map[string]string{"vectr": "LONGTEXT", "vector": "LONGTEXT NOT NULL", "json": "", "bit": "NOPE(", "Vector": "TEXT"}
	cfg.Applier.SkipDDL = []SkipDDL{{}, {Pattern: "("}}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("invalid type-map and skip-ddl accepted")
	}
	for _, want := range []string{
		"applier.type-map.vectr: \"vectr\" is not a TiDB column type name",
		"applier.type-map.vector: \"LONGTEXT NOT NULL\" is not a column type alone",
		"applier.type-map.json: empty column type",
		"applier.type-map.bit: \"NOPE(\" is not a column type",
		"applier.type-map.vector: same type as applier.type-map.Vector",
		"applier.skip-ddl[0]: set commit-ts or pattern",
		"applier.skip-ddl[1].pattern: error parsing regexp",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}

	a := ApplierConfig{SkipDDL: []SkipDDL{{CommitTs: 5}, {Pattern: `(?i)^alter table`}, {CommitTs: 7, Pattern: "DROP"}}}
	for _, c := range []struct {
		ts    uint64
		query string
		rule  string
	}{
		{5, "CREATE TABLE t (a INT)", "applier.skip-ddl[0]: commit-ts 5"},
		{6, "ALTER TABLE t ADD c INT", "applier.skip-ddl[1]: pattern \"(?i)^alter table\""},
		{7, "DROP TABLE t", "applier.skip-ddl[2]: commit-ts 7 and pattern \"DROP\""},
		{7, "CREATE TABLE t (a INT)", ""},
		{8, "DROP TABLE t", ""},
	} {
		if rule, _ := a.skipRule(c.ts, c.query); rule != c.rule {
			t.Errorf("skipRule(%d, %q) = %q, want %q", c.ts, c.query, rule, c.rule)
		}
	}
}

// TestVectorTypeMapAndSkipDDL runs the replicator on the real fallback: a VECTOR column
// is created with applier.type-map's type and its values arrive as their text; a DDL the
// fallback rejects stops the applier with an error naming applier.skip-ddl and the
// commit ts, and passes once skip-ddl names it (recorded in ddl_applied.skipped); a
// skip-ddl pattern skips another; an unknown type's rejection names applier.type-map.
func TestVectorTypeMapAndSkipDDL(t *testing.T) {
	down := testenv.Downstream(t)
	f := newFeed(t, 2)
	s := down.Name
	t1, t2, t3, t4, t5 := f.next(), f.next(), f.next(), f.next(), f.next()
	vec := func(name string, v any) open.Column {
		return open.Column{Name: name, Type: open.TypeTiDBVectorFloat32, Flags: open.FlagNullable, Value: v}
	}
	f.ddl(t1, s, "emb", "CREATE TABLE `"+s+"`.`emb` (`id` BIGINT NOT NULL,`e` VECTOR(3) NULL,`f` VECTOR NULL,PRIMARY KEY(`id`) /*T![clustered_index] CLUSTERED */)", 3)
	f.rows(0, ins(t2, s, "emb", ci("id", 1, pk), vec("e", "[1,2,3]"), vec("f", "[0.5,-1e+10,3.25]")),
		ins(t2, s, "emb", ci("id", 2, pk), vec("e", nil), vec("f", "[]")))
	f.rows(1, ins(t2, s, "emb", ci("id", 3, pk), vec("e", "[4,5,6]"), vec("f", "[1]")))
	// MariaDB 10.11 has no expression indexes: rejected.
	f.ddl(t3, s, "emb", "ALTER TABLE `"+s+"`.`emb` ADD INDEX `ix`((`id` + 1))", 7)
	f.ddl(t4, s, "emb", "ALTER TABLE `"+s+"`.`emb` ADD INDEX `iy`((`id` * 2))", 7)
	f.rows(0, upd(t5, s, "emb", []open.Column{ci("id", 3, pk), vec("e", "[4,5,6]"), vec("f", "[1]")},
		[]open.Column{ci("id", 3, pk), vec("e", "[7,8,9]"), vec("f", "[1]")}))
	f.resolved(t5)

	cfg := testConfig(t, f, down)
	cfg.Applier.TypeMap = map[string]string{"vector": "MEDIUMTEXT"}
	run := start(t, cfg, nil)
	err := run.result(t)
	for _, want := range []string{fmt.Sprintf("DDL at commit ts %d rejected by downstream", t3),
		fmt.Sprintf("[[applier.skip-ddl]] commit-ts = %d", t3)} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("rejected DDL: %v; want an error saying %q", err, want)
		}
	}
	equal(t, "emb before the rejected DDL", dump(t, down.DB, s, "emb"), []string{"1|[1,2,3]|[0.5,-1e+10,3.25]", "2|NULL|[]", "3|[4,5,6]|[1]"})
	var typ string
	if err := down.QueryRow("SELECT DATA_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA=? AND TABLE_NAME='emb' AND COLUMN_NAME='e'", s).Scan(&typ); err != nil || typ != "mediumtext" {
		t.Fatalf("emb.e is %q (%v), want mediumtext (applier.type-map)", typ, err)
	}

	cfg.Applier.SkipDDL = []SkipDDL{{CommitTs: t3}, {Pattern: "ADD INDEX `iy`"}}
	run = start(t, cfg, nil)
	run.wait(t, t5)
	equal(t, "emb", dump(t, down.DB, s, "emb"), []string{"1|[1,2,3]|[0.5,-1e+10,3.25]", "2|NULL|[]", "3|[7,8,9]|[1]"})
	rows, err := down.Query("SELECT commit_ts, executed, skipped FROM "+ident.Quote(cfg.Applier.MetaSchema)+".ddl_applied WHERE changefeed=? ORDER BY commit_ts", cfg.Changefeed.ID)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var ts uint64
		var executed, skipped string
		if err := rows.Scan(&ts, &executed, &skipped); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d|%t|%s", ts, executed != "", skipped))
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	equal(t, "ddl_applied", got, []string{
		fmt.Sprintf("%d|true|", t1),
		fmt.Sprintf("%d|false|applier.skip-ddl[0]: commit-ts %d", t3, t3),
		fmt.Sprintf("%d|false|applier.skip-ddl[1]: pattern \"ADD INDEX `iy`\"", t4),
	})
	if err := run.stop(t); err != nil {
		t.Fatal(err)
	}

	// A type the fallback does not know (VECTOR kept by an identity map): the error
	// names the type-map entry that gets past it.
	t6 := f.next()
	f.ddl(t6, s, "emb2", "CREATE TABLE `"+s+"`.`emb2` (`id` INT PRIMARY KEY, `e` VECTOR(2))", 3)
	f.resolved(t6)
	cfg.Applier.TypeMap = map[string]string{"vector": "VECTOR"}
	run = start(t, cfg, nil)
	err = run.result(t)
	for _, want := range []string{"applier.type-map = { vector = ", fmt.Sprintf("[[applier.skip-ddl]] commit-ts = %d", t6)} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("unknown type: %v; want an error saying %q", err, want)
		}
	}
}

// TestMetaMigrationSkippedColumn: a meta schema at version 1 (before ddl_applied.skipped)
// migrates, keeps its rows, and a migration that ran but was not recorded (a crash
// between the two) runs again harmlessly.
func TestMetaMigrationSkippedColumn(t *testing.T) {
	down := testenv.Downstream(t)
	schema := ident.Quote(down.Name)
	m := newMeta(down.DB, down.Name, "cf", 30*time.Second)
	ctx := context.Background()
	exec(t, down.DB, "CREATE TABLE "+schema+".schema_migrations (version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB")
	for _, s := range migrations[0].Stmts {
		exec(t, down.DB, m.q(s))
	}
	exec(t, down.DB, "INSERT INTO "+schema+".schema_migrations (version, name) VALUES (1, 'v1')")
	exec(t, down.DB, "INSERT INTO "+schema+".ddl_applied (changefeed, commit_ts, query_hash, query, executed) VALUES ('cf', 1, 'h', 'q', 'e')")
	if err := m.migrate(ctx); err != nil {
		t.Fatal(err)
	}
	exec(t, down.DB, "DELETE FROM "+metaschema.Table(down.Name, metaschema.VersionTable)+" WHERE component='cdc' AND version > 1")
	if err := m.migrate(ctx); err != nil {
		t.Fatalf("migrating again after an unrecorded migration: %v", err)
	}
	if err := m.recordDDL(ctx, newDDLKey(2, "x"), "x", "", strings.Repeat("é", 2000)); err != nil {
		t.Fatal(err)
	}
	var got []string
	rows, err := down.Query("SELECT commit_ts, CHAR_LENGTH(skipped) FROM " + schema + ".ddl_applied ORDER BY commit_ts")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var ts, n int
		if err := rows.Scan(&ts, &n); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprint(ts, "|", n))
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	equal(t, "ddl_applied skipped lengths", got, []string{"1|0", "2|1024"})
}

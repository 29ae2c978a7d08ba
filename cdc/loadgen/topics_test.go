package loadgen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

func TestTopicExpression(t *testing.T) {
	for _, tc := range []struct {
		expr, schema, want string
		bad                []string // fragments of the error; none: valid
	}{
		{expr: "parity", schema: "s1", want: "parity"},
		{expr: "parity_{schema}", schema: "s1", want: "parity_s1"},
		{expr: "{schema}", schema: "shop", want: "shop"},
		{expr: "cdc.{schema}-v1", schema: "shop", want: "cdc.shop-v1"},
		// TiCDC's substitution: characters outside Kafka's alphabet become '_'.
		{expr: "p_{schema}", schema: "my db$1", want: "p_my_db_1"},
		{expr: "{schema}", schema: ".", want: "_"},
		{expr: "{schema}", schema: "..", want: "__"},
		{expr: "p{schema}", schema: strings.Repeat("x", 300), want: "p" + strings.Repeat("x", 248)},
		{expr: "", bad: []string{"required"}},
		{expr: "p_{table}", bad: []string{"{table} is not supported"}},
		{expr: "p_{db}", bad: []string{"unknown placeholder {db}"}},
		{expr: "p_{Schema}", bad: []string{"unknown placeholder {Schema}"}},
		{expr: "{schema}_{schema}", bad: []string{"{schema} may appear once"}},
		{expr: "p/{schema} x", bad: []string{`characters "/ "`}},
		{expr: "..", bad: []string{"not a valid Kafka topic name"}},
		{expr: strings.Repeat("t", 250), bad: []string{"longer than Kafka's 249"}},
	} {
		err := validateTopic(tc.expr)
		if len(tc.bad) == 0 {
			if err != nil {
				t.Errorf("validateTopic(%q): %v", tc.expr, err)
			}
			if got := topicFor(tc.expr, tc.schema); got != tc.want {
				t.Errorf("topicFor(%q, %q) = %q, want %q", tc.expr, tc.schema, got, tc.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("validateTopic(%q): no error, want %q", tc.expr, tc.bad)
			continue
		}
		for _, b := range tc.bad {
			if !strings.Contains(err.Error(), b) {
				t.Errorf("validateTopic(%q) = %q, want it to say %q", tc.expr, err, b)
			}
		}
	}
}

func TestConfigValidateDatabases(t *testing.T) {
	for _, tc := range []struct {
		name      string
		edit      func(*Config)
		wantKeys  []string // every one named; none: valid
		wantTopic []string // Topics() of a valid configuration
	}{
		{name: "one schema, placeholder", edit: func(c *Config) { c.Topic = "p_{schema}" }, wantTopic: []string{"p_parity_load"}},
		{name: "several schemas, one topic", edit: func(c *Config) { c.Databases = []string{"a", "b"} }, wantTopic: []string{"parity"}},
		{name: "several schemas, their topics", edit: func(c *Config) { c.Databases = []string{"a", "b", "c"}; c.Topic = "t-{schema}" },
			wantTopic: []string{"t-a", "t-b", "t-c"}},
		// Two schema names substituted to one topic name share it.
		{name: "shared by substitution", edit: func(c *Config) { c.Databases = []string{"a b", "a$b"}; c.Topic = "{schema}" },
			wantTopic: []string{"a_b"}},
		{name: "unknown placeholder", edit: func(c *Config) { c.Databases = []string{"a", "b"}; c.Topic = "t_{database}" }, wantKeys: []string{"topic:"}},
		{name: "bad schemas", edit: func(c *Config) { c.Databases = []string{"a", "", "A", strings.Repeat("x", 65)} },
			wantKeys: []string{"databases[1]: empty", "databases[2]: schema \"A\" is also databases[0]", "databases[3]: schema name"}},
		{name: "no schema", edit: func(c *Config) { c.Database = "" }, wantKeys: []string{"database: required"}},
		{name: "databases replace database", edit: func(c *Config) { c.Database = ""; c.Databases = []string{"a"} }, wantTopic: []string{"parity"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.edit(&cfg)
			err := cfg.Validate()
			if len(tc.wantKeys) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				if got := cfg.Topics(); !slices.Equal(got, tc.wantTopic) {
					t.Fatalf("Topics() = %q, want %q", got, tc.wantTopic)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate: no error, want %q", tc.wantKeys)
			}
			for _, k := range tc.wantKeys {
				if !strings.Contains(err.Error(), k) {
					t.Errorf("Validate = %q, does not say %q", err, k)
				}
			}
		})
	}
}

// TestTopicPerSchemaReplicates publishes a workload over three schemas, each routed to
// its own topic (TiCDC's topic = "prefix_{schema}"), then checks each topic on its own:
// it carries only its schema's row events and DDLs, every partition ends with the run's
// final resolved ts, and parity's replicator fed with that one topic builds a fallback
// schema equal to TiDB's at that ts. Transactions spanning schemas are split by topic,
// as TiCDC splits them. Without import the CREATE DDLs travel through the topics; with
// it the import fills and copies every schema at one TSO.
func TestTopicPerSchemaReplicates(t *testing.T) {
	for _, imp := range []int{0, 300} {
		t.Run(fmt.Sprintf("import=%d", imp), func(t *testing.T) { testTopicPerSchema(t, imp) })
	}
}

func testTopicPerSchema(t *testing.T, importRows int) {
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	downDSN := testenv.Require(t, testenv.EnvDownstream)
	broker := testenv.Kafka(t)
	tz := map[string]string{"time_zone": "'+00:00'"}
	upRoot := openTest(t, testenv.DSN(t, testenv.EnvUpstream, "", tz))
	downRoot := openTest(t, testenv.DSN(t, testenv.EnvDownstream, "", tz))

	const partitions = 2
	schemas := []string{testenv.UniqueName("lgsa"), testenv.UniqueName("lgsb"), testenv.UniqueName("lgsc")}
	fallback := func(s string) string { return s + "_fb" }
	t.Cleanup(func() {
		for _, s := range schemas {
			_, _ = upRoot.Exec("DROP DATABASE IF EXISTS " + ident.Quote(s))
			_, _ = downRoot.Exec("DROP DATABASE IF EXISTS " + ident.Quote(s))
			_, _ = downRoot.Exec("DROP DATABASE IF EXISTS " + ident.Quote(fallback(s)))
		}
	})
	cfg := DefaultConfig()
	cfg.Upstream = upDSN
	cfg.Brokers = []string{broker}
	cfg.Topic = strings.ReplaceAll(testenv.UniqueName("lgps"), "_", "-") + "_{schema}"
	cfg.Partitions = partitions
	cfg.Databases = schemas
	cfg.Tables = 2
	cfg.Workers = 3
	cfg.Transactions = 240
	cfg.MultiTable = 0.6 // many transactions span schemas (4 tables per schema, 12 in all)
	cfg.Seed = 7
	if importRows > 0 {
		cfg.ImportRows = importRows
		cfg.Downstream = downDSN
	}
	for _, s := range schemas {
		testenv.DeleteTopicAtEnd(t, broker, cfg.TopicOf(s))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Transactions != 240 {
		t.Fatalf("%d transactions, want 240", res.Transactions)
	}
	if topics := cfg.Topics(); len(topics) != len(schemas) {
		t.Fatalf("topics %q: want one per schema", topics)
	}

	// Each topic alone: only its schema, a final resolved ts on every partition.
	commitTopics := map[uint64]map[string]bool{} // commit ts -> schemas its rows went to
	var records int64
	for _, s := range schemas {
		topic := cfg.TopicOf(s)
		if n, err := TopicPartitions(ctx, cfg.Brokers, topic); err != nil || n != partitions {
			t.Fatalf("topic %s: %d partitions, %v; want %d", topic, n, err, partitions)
		}
		ddls := map[string]int{}
		rows := 0
		for p, recs := range readTopic(t, topic, partitions) {
			records += int64(len(recs))
			var last open.Event
			for _, r := range recs {
				for _, ev := range r.events {
					last = ev
					switch ev.Kind {
					case open.KindRow:
						if ev.Schema != s {
							t.Fatalf("topic %s partition %d offset %d: a row of %s.%s; the topic is %s's", topic, p, r.offset, ev.Schema, ev.Table, s)
						}
						rows++
						if commitTopics[ev.CommitTs] == nil {
							commitTopics[ev.CommitTs] = map[string]bool{}
						}
						commitTopics[ev.CommitTs][s] = true
					case open.KindDDL:
						if ev.Schema != s {
							t.Fatalf("topic %s partition %d offset %d: DDL %q of schema %s", topic, p, r.offset, ev.Query, ev.Schema)
						}
						ddls[ev.Table]++
					}
				}
			}
			if last.Kind != open.KindResolved || last.CommitTs != res.ResolvedTs {
				t.Fatalf("topic %s partition %d ends with %v at %d, want the final resolved ts %d", topic, p, last.Kind, last.CommitTs, res.ResolvedTs)
			}
		}
		if rows == 0 {
			t.Fatalf("topic %s: no row events", topic)
		}
		if importRows == 0 {
			// CREATE DATABASE ("" table) and each CREATE TABLE, on every partition.
			want := map[string]int{"": partitions, "sbtest1": partitions, "sbtest2": partitions, AllTypesTable: partitions, KeylessTable: partitions}
			for k, v := range want {
				if ddls[k] != v {
					t.Fatalf("topic %s: DDLs by table %v, want %v", topic, ddls, want)
				}
			}
		} else if len(ddls) != 0 {
			t.Fatalf("topic %s: DDLs %v after an import (the changefeed starts at the import ts)", topic, ddls)
		}
	}
	if records != res.Records {
		t.Fatalf("%d records in the topics, the run reports %d", records, res.Records)
	}
	spanning := 0
	for _, ss := range commitTopics {
		if len(ss) > 1 {
			spanning++
		}
	}
	if spanning == 0 {
		t.Fatalf("no transaction changed more than one schema (%d transactions)", len(commitTopics))
	}
	t.Logf("%d transactions, %d of them over several schemas; %d records in %d topics", res.Transactions, spanning, records, len(schemas))

	// Each topic into its own fallback schema (renamed: a row of another schema in the
	// topic would land in a schema nobody compares, which the check below catches).
	for _, s := range schemas {
		rcfg := cdc.DefaultConfig()
		rcfg.Changefeed.ID = "lgps"
		rcfg.Changefeed.Brokers, rcfg.Changefeed.Topics = cfg.Brokers, []string{cfg.TopicOf(s)}
		rcfg.Changefeed.StartTs = res.ImportTs // 0 without import: the topic's DDLs build the schema
		rcfg.Changefeed.SchemaMap = map[string]string{s: fallback(s)}
		rcfg.Downstream.DSN = downDSN
		rcfg.Applier.MetaSchema = testenv.UniqueName("lgpm")
		rcfg.Applier.SpillDir = t.TempDir()
		t.Cleanup(func() { _, _ = downRoot.Exec("DROP DATABASE IF EXISTS " + ident.Quote(rcfg.Applier.MetaSchema)) })
		if importRows > 0 {
			// The import wrote the schema under its own name; the fallback is its copy.
			renameSchema(t, downRoot, s, fallback(s))
		}
		applyTopic(t, ctx, rcfg, res.ResolvedTs)
		testenv.AssertSame(t, ctx,
			testenv.Side{Label: "TiDB " + s, DB: upRoot, Schema: s, TS: res.ResolvedTs},
			testenv.Side{Label: "fallback " + fallback(s), DB: downRoot, Schema: fallback(s)}, testenv.Options{})
	}
	for _, s := range schemas {
		var n int
		if err := downRoot.QueryRow("SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", s).Scan(&n); err != nil || n != 0 {
			t.Fatalf("the fallback has a schema %s (%d, %v): a topic carried another schema's events", s, n, err)
		}
	}
}

// applyTopic runs a replicator until it has applied ts, then stops it.
func applyTopic(t *testing.T, ctx context.Context, cfg cdc.Config, ts uint64) {
	t.Helper()
	rep, err := cdc.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- rep.Run(rctx) }()
	applied := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(rctx, 2*time.Minute)
		defer cancel()
		applied <- rep.WaitApplied(wctx, ts)
	}()
	select {
	case err := <-applied:
		stop()
		rerr := <-done
		if err != nil {
			t.Fatalf("replicator of %v did not apply ts %d: %v (run: %v; status %+v)", cfg.Changefeed.Topics, ts, err, rerr, rep.Status())
		}
		if rerr != nil && !errors.Is(rerr, context.Canceled) {
			t.Fatalf("replicator of %v: %v", cfg.Changefeed.Topics, rerr)
		}
	case err := <-done: // stopped before applying ts
		stop()
		<-applied
		t.Fatalf("replicator of %v stopped before applying ts %d: %v", cfg.Changefeed.Topics, ts, err)
	}
}

// openTest opens dsn for the test (skipping it when the server does not answer, failing
// with CI=true, as testenv does).
func openTest(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		if os.Getenv("CI") != "true" {
			t.Skipf("server does not answer (%v); run `make env-up`", err)
		}
		t.Fatalf("server does not answer: %v", err)
	}
	return db
}

// renameSchema moves every table of schema from to a new schema to (MariaDB has no
// RENAME DATABASE).
func renameSchema(t *testing.T, db *sql.DB, from, to string) {
	t.Helper()
	tables, err := testenv.ListTables(context.Background(), db, from)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE DATABASE " + ident.Quote(to)); err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if _, err := db.Exec("RENAME TABLE " + ident.Quote(from) + "." + ident.Quote(tb) + " TO " + ident.Quote(to) + "." + ident.Quote(tb)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec("DROP DATABASE " + ident.Quote(from)); err != nil {
		t.Fatal(err)
	}
}

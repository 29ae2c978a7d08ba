package loadgen

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/testenv"
)

// record is one decoded Kafka record.
type record struct {
	offset int64
	events []open.Event
}

// readTopic reads and decodes every record of every partition of topic.
func readTopic(t *testing.T, topic string, partitions int) [][]record {
	t.Helper()
	dec, err := open.NewDecoder(open.DefaultDecoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]record, partitions)
	for p, msgs := range testenv.ReadTopic(t, testenv.Kafka(t), topic, partitions) {
		for _, m := range msgs {
			evs, err := dec.Decode(m.Key, m.Value)
			if err != nil {
				t.Fatalf("decode partition %d offset %d: %v", p, m.Offset, err)
			}
			out[p] = append(out[p], record{offset: m.Offset, events: evs})
		}
	}
	return out
}

// canon renders a row image independent of column order.
func canon(cols []open.Column) string {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = fmt.Sprintf("%s=%T:%v", c.Name, c.Value, c.Value)
	}
	sort.Strings(parts)
	return strings.Join(parts, "|")
}

func handleKey(cols []open.Column) string {
	var parts []string
	for _, c := range cols {
		if c.IsHandle() {
			parts = append(parts, c.Name+"="+ColumnValueString(c))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// state is a table's content: handle key (or full row for keyless tables) -> row -> count.
type state map[string]map[string]int

func (s state) add(table, key, row string, n int) {
	if s[table] == nil {
		s[table] = map[string]int{}
	}
	k := key + "#" + row
	s[table][k] += n
	if s[table][k] == 0 {
		delete(s[table], k)
	}
}

// tidbState reads every generated table of db at ts.
func tidbState(t *testing.T, dsn, db string, ts uint64, tables []string) state {
	t.Helper()
	ctx := context.Background()
	sdb, err := openDB(dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer sdb.Close()
	conn, err := sdb.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET @@tidb_snapshot = ?", strconv.FormatUint(ts, 10)); err != nil {
		t.Fatalf("snapshot %d: %v", ts, err)
	}
	return readState(t, ctx, sdb, conn, db, tables)
}

type queryer interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readState reads the tables of db through q, converting values with the column
// metadata that the server of metaDB has for them.
func readState(t *testing.T, ctx context.Context, metaDB *sql.DB, q queryer, db string, tables []string) state {
	t.Helper()
	st := state{}
	for _, name := range tables {
		meta, err := upstream.LoadTable(ctx, metaDB, db, name)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := q.QueryContext(ctx, "SELECT "+meta.SelectList()+" FROM "+meta.QualifiedName())
		if err != nil {
			t.Fatal(err)
		}
		imgs, _, err := upstream.ScanRows(rows, meta, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, img := range imgs {
			st.add(name, handleKey(img), canon(img), 1)
		}
	}
	return st
}

func diffStates(t *testing.T, what string, got, want state) {
	t.Helper()
	n := 0
	for table := range union(got, want) {
		for k := range union(got[table], want[table]) {
			if got[table][k] != want[table][k] {
				if n < 5 {
					t.Errorf("%s: table %s row %s: replayed %d, TiDB %d", what, table, k, got[table][k], want[table][k])
				}
				n++
			}
		}
	}
	if n > 0 {
		t.Fatalf("%s: %d rows differ", what, n)
	}
}

// union returns the keys of a and b.
func union[V any](a, b map[string]V) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// TestRunAgainstTiDB runs the generator against the real TiDB and Kafka and checks what
// it published: every row in its dispatcher's partition, no row at or below a resolved
// ts after that resolved event, and the events replayed in commit-ts order from the
// start reproduce TiDB exactly at intermediate resolved ts values and at the final one
// (which validates commit ts, old and new row images).
func TestRunAgainstTiDB(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
	}{
		{"index-value dispatcher, split pk updates", func(c *Config) { c.Dispatcher = DispatchIndexValue }},
		{"table dispatcher, raw pk updates, import", func(c *Config) {
			c.Dispatcher = DispatchTable
			c.RawPKUpdates = true
			c.ImportRows = 200
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := testenv.Upstream(t)
			topic := testenv.NewTopic(t, "loadgen", 3)
			cfg := DefaultConfig()
			cfg.Upstream = testenv.Require(t, testenv.EnvUpstream)
			cfg.Brokers = []string{testenv.Kafka(t)}
			cfg.Topic = topic
			cfg.Database = up.Name
			cfg.Tables = 2
			cfg.Transactions = 300
			cfg.Workers = 4
			cfg.PKUpdate = 0.3
			cfg.FlushInterval = 5 * time.Millisecond
			cfg.ResolvedInterval = 50 * time.Millisecond
			cfg.Seed = 42
			tc.mutate(&cfg)
			if cfg.ImportRows > 0 {
				down := testenv.NewDB(t, testenv.EnvDownstream, "lgdown")
				cfg.Downstream = testenv.Require(t, testenv.EnvDownstream)
				// The import creates the schema under the upstream name; drop it afterwards.
				t.Cleanup(func() { _, _ = down.Exec("DROP DATABASE IF EXISTS `" + up.Name + "`") })
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			res, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("result %+v", res)
			if res.Transactions != 300 || res.ResolvedTs <= res.StartTs || res.Rows == 0 {
				t.Fatalf("result %+v: want 300 transactions and a resolved ts above the start", res)
			}
			tables := []string{"sbtest1", "sbtest2", AllTypesTable, KeylessTable}
			disp, _ := NewDispatcher(cfg.Dispatcher)

			parts := readTopic(t, topic, 3)
			var rows []open.Event
			var resolvedSeen []uint64
			ddls := map[string]int{}
			for p, recs := range parts {
				var lastResolved uint64
				seen := map[string]bool{}
				for _, rec := range recs {
					// A Kafka write the generator retried may have landed twice; a record
					// repeating an earlier one of the partition is that, not a new change.
					id := fmt.Sprint(rec.events)
					if seen[id] {
						continue
					}
					seen[id] = true
					for _, ev := range rec.events {
						switch ev.Kind {
						case open.KindResolved:
							if ev.CommitTs < lastResolved {
								t.Fatalf("partition %d offset %d: resolved %d after %d", p, rec.offset, ev.CommitTs, lastResolved)
							}
							lastResolved = ev.CommitTs
							if p == 0 {
								resolvedSeen = append(resolvedSeen, ev.CommitTs)
							}
						case open.KindDDL:
							ddls[ev.Query]++
						case open.KindRow:
							if ev.CommitTs <= lastResolved {
								t.Fatalf("partition %d offset %d: row at ts %d after resolved %d", p, rec.offset, ev.CommitTs, lastResolved)
							}
							if want, _ := disp.Dispatch(&ev, 3); want != p {
								t.Fatalf("partition %d offset %d: %s.%s row belongs to partition %d", p, rec.offset, ev.Schema, ev.Table, want)
							}
							if ev.CommitTs <= res.StartTs {
								t.Fatalf("row at ts %d not after the changefeed start %d", ev.CommitTs, res.StartTs)
							}
							rows = append(rows, ev)
						}
					}
				}
				if lastResolved != res.ResolvedTs {
					t.Fatalf("partition %d ends with resolved %d, want the final %d", p, lastResolved, res.ResolvedTs)
				}
			}
			if int64(len(rows)) != res.Rows {
				t.Fatalf("read %d row events, generator published %d", len(rows), res.Rows)
			}
			if cfg.ImportRows == 0 {
				for _, q := range ddls {
					if q != 3 {
						t.Fatalf("DDL broadcast to %d partitions, want 3: %v", q, ddls)
					}
				}
				if len(ddls) != len(tables) {
					t.Fatalf("%d DDLs, want one CREATE TABLE per table: %v", len(ddls), ddls)
				}
			} else if len(ddls) != 0 {
				t.Fatalf("an import changefeed carries no DDL, got %v", ddls)
			}
			sort.SliceStable(rows, func(i, j int) bool { return rows[i].CommitTs < rows[j].CommitTs })

			// Replay from the start state, checking old images against the replayed state.
			st := state{}
			if cfg.ImportRows > 0 {
				st = tidbState(t, cfg.Upstream, up.Name, res.StartTs, tables)
				dsn, _ := mysql.ParseDSN(cfg.Downstream)
				dsn.DBName = up.Name
				got := tidbLikeDownstream(t, dsn.FormatDSN(), up.Name, cfg.Upstream, tables)
				diffStates(t, "import", got, st)
			}
			checkpoints := []uint64{resolvedSeen[len(resolvedSeen)/3], resolvedSeen[2*len(resolvedSeen)/3], res.ResolvedTs}
			i := 0
			for _, cp := range checkpoints {
				for ; i < len(rows) && rows[i].CommitTs <= cp; i++ {
					ev := rows[i]
					switch ev.Op {
					case open.OpInsert:
						if n := countKey(st, ev.Table, handleKey(ev.Columns)); n > 0 && handleKey(ev.Columns) != "" {
							t.Fatalf("insert into %s at ts %d: key %s already present", ev.Table, ev.CommitTs, handleKey(ev.Columns))
						}
						st.add(ev.Table, handleKey(ev.Columns), canon(ev.Columns), 1)
					case open.OpUpdate, open.OpDelete:
						old := ev.Columns
						if ev.Op == open.OpUpdate {
							old = ev.OldColumns
						}
						k := handleKey(old) + "#" + canon(old)
						if st[ev.Table][k] <= 0 {
							t.Fatalf("%s of %s at ts %d: old row %s not in the replayed state", ev.Op, ev.Table, ev.CommitTs, k)
						}
						st.add(ev.Table, handleKey(old), canon(old), -1)
						if ev.Op == open.OpUpdate {
							st.add(ev.Table, handleKey(ev.Columns), canon(ev.Columns), 1)
						}
					}
				}
				diffStates(t, fmt.Sprintf("at resolved ts %d", cp), st, tidbState(t, cfg.Upstream, up.Name, cp, tables))
			}
		})
	}
}

func countKey(st state, table, key string) int {
	n := 0
	for k, c := range st[table] {
		if strings.HasPrefix(k, key+"#") {
			n += c
		}
	}
	return n
}

// tidbLikeDownstream reads the imported downstream tables with the upstream's column
// metadata, so values convert exactly like TiDB's.
func tidbLikeDownstream(t *testing.T, downDSN, db, upDSN string, tables []string) state {
	t.Helper()
	ctx := context.Background()
	updb, err := openDB(upDSN, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer updb.Close()
	d, _ := sessionDSN(downDSN, db, "+00:00", false)
	down, err := openDB(d, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	return readState(t, ctx, updb, down, db, tables)
}

// TestCreatesMissingTopic: like TiCDC with partition-num, the generator creates a topic
// that does not exist, and Reset starts the database over.
func TestCreatesMissingTopic(t *testing.T) {
	up := testenv.Upstream(t)
	broker := testenv.Kafka(t)
	topic := strings.ReplaceAll(testenv.UniqueName("lgnew"), "_", "-")
	testenv.DeleteTopicAtEnd(t, broker, topic)
	cfg := DefaultConfig()
	cfg.Upstream = testenv.Require(t, testenv.EnvUpstream)
	cfg.Brokers = []string{broker}
	cfg.Topic = topic
	cfg.Partitions = 2
	cfg.Database = up.Name
	cfg.Tables = 1
	cfg.AllTypes, cfg.Keyless = false, false
	cfg.Transactions = 5
	cfg.Reset = true
	if _, err := up.Exec("CREATE TABLE leftover (a INT)"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	n, err := TopicPartitions(ctx, cfg.Brokers, topic)
	if err != nil || n != 2 {
		t.Fatalf("topic %s: %d partitions, %v; want 2", topic, n, err)
	}
	if res.Transactions != 5 {
		t.Fatalf("%d transactions, want 5", res.Transactions)
	}
	var left int
	if err := up.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'leftover'", up.Name).Scan(&left); err != nil || left != 0 {
		t.Fatalf("reset kept table leftover (%d, %v)", left, err)
	}
}

func TestConfigValidateNamesEveryProblem(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Topic = ""
	cfg.Workers = 0
	cfg.Dispatcher = "columns"
	cfg.ImportRows = 10 // without downstream
	err := cfg.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	for _, key := range []string{"topic:", "workers:", "dispatcher:", "downstream:"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error %q does not name %s", err, key)
		}
	}
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Errorf("defaults invalid: %v", err)
	}
}

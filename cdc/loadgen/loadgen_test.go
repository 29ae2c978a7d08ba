package loadgen

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
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

// The replayed events and TiDB meet in internal/testenv's canonical form. TiDB is read
// by testenv (plain SQL, not cdc/upstream, which the generator builds its events with);
// an event's values are rendered by modelRow into the text TiDB sends for them, from the
// open protocol's value and the column's information_schema type alone. So a conversion
// bug in upstream.ScanRows or the decoder shows as a difference instead of appearing on
// both sides.

// modelRow renders an event's row image (columns in any order) as a row of desc in
// testenv's canonical form. Every column of the table must be in the image exactly once,
// with the Go type the open protocol gives its type (cdc/open's Column contract).
func modelRow(desc *testenv.Table, cols []open.Column) (testenv.Row, error) {
	if len(cols) != len(desc.Columns) {
		return nil, fmt.Errorf("table %s: the image has %d columns, the table %d", desc.FullName(), len(cols), len(desc.Columns))
	}
	row := make(testenv.Row, len(desc.Columns))
	seen := make([]bool, len(desc.Columns))
	for _, c := range cols {
		i := desc.Col(c.Name)
		if i < 0 || seen[i] {
			return nil, fmt.Errorf("table %s: the image's column %s is unknown or repeated", desc.FullName(), c.Name)
		}
		seen[i] = true
		var raw []byte
		if c.Value != nil {
			text, err := serverText(desc.Columns[i], c.Value)
			if err != nil {
				return nil, fmt.Errorf("table %s column %s: %w", desc.FullName(), c.Name, err)
			}
			raw = []byte(text)
		}
		v, err := desc.NewValue(i, raw)
		if err != nil {
			return nil, err
		}
		row[i] = v
	}
	return row, nil
}

// serverText is the text TiDB sends in the text protocol for a non-NULL value carried by
// the open protocol in a column of type col.
func serverText(col testenv.Column, v any) (string, error) {
	wrong := func() (string, error) {
		return "", fmt.Errorf("%s value %#v (%T) is not what the open protocol carries for it", col.ColumnType, v, v)
	}
	unsigned := strings.Contains(col.ColumnType, "unsigned")
	switch col.DataType {
	case "tinyint", "smallint", "mediumint", "int", "integer", "bigint":
		if x, ok := v.(uint64); ok && unsigned {
			return strconv.FormatUint(x, 10), nil
		}
		if x, ok := v.(int64); ok && !unsigned {
			return strconv.FormatInt(x, 10), nil
		}
	case "year":
		if x, ok := v.(int64); ok {
			return fmt.Sprintf("%04d", x), nil
		}
	case "float":
		if x, ok := v.(float64); ok && float64(float32(x)) == x {
			return strconv.FormatFloat(x, 'g', -1, 32), nil
		}
	case "double":
		if x, ok := v.(float64); ok {
			return strconv.FormatFloat(x, 'g', -1, 64), nil
		}
	case "decimal", "date", "datetime", "timestamp", "time", "json",
		"char", "varchar", "tinytext", "text", "mediumtext", "longtext":
		if x, ok := v.(string); ok {
			return x, nil
		}
	case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
		if x, ok := v.([]byte); ok {
			return string(x), nil
		}
	case "bit": // the value's bytes, big-endian, as many as the width needs
		x, ok := v.(uint64)
		width, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(col.ColumnType, "bit("), ")"))
		if !ok || err != nil || width < 1 || width > 64 || (width < 64 && x>>width != 0) {
			return wrong()
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], x)
		return string(b[8-(width+7)/8:]), nil
	case "enum": // the 1-based index of the member; 0 is the empty error value
		x, ok := v.(uint64)
		members, err := typeMembers(col.ColumnType)
		if !ok || err != nil || x > uint64(len(members)) {
			return wrong()
		}
		if x == 0 {
			return "", nil
		}
		return members[x-1], nil
	case "set": // a bitmask of the members, rendered in definition order
		x, ok := v.(uint64)
		members, err := typeMembers(col.ColumnType)
		if !ok || err != nil || (len(members) < 64 && x>>len(members) != 0) {
			return wrong()
		}
		var in []string
		for i, m := range members {
			if x&(1<<i) != 0 {
				in = append(in, m)
			}
		}
		return strings.Join(in, ","), nil
	default:
		return "", fmt.Errorf("no rendering for type %s", col.ColumnType)
	}
	return wrong()
}

// typeMembers parses the members of an ENUM or SET COLUMN_TYPE: enum('a','b”c').
func typeMembers(columnType string) ([]string, error) {
	lp := strings.IndexByte(columnType, '(')
	if lp < 0 || !strings.HasSuffix(columnType, ")") {
		return nil, fmt.Errorf("column type %q has no members", columnType)
	}
	s := columnType[lp+1 : len(columnType)-1]
	var out []string
	for len(s) > 0 {
		if s[0] != '\'' {
			return nil, fmt.Errorf("column type %q: member not quoted at %q", columnType, s)
		}
		var m strings.Builder
		i := 1
		for ; i < len(s); i++ {
			if s[i] == '\'' {
				if i+1 < len(s) && s[i+1] == '\'' {
					m.WriteByte('\'')
					i++
					continue
				}
				break
			}
			m.WriteByte(s[i])
		}
		if i >= len(s) {
			return nil, fmt.Errorf("column type %q: unterminated member", columnType)
		}
		out = append(out, m.String())
		s = strings.TrimPrefix(s[i+1:], ",")
	}
	return out, nil
}

// model is the replayed content of the generated tables: per table, each distinct
// canonical row and its number of copies.
type model struct {
	desc map[string]*testenv.Table
	rows map[string]map[string]*copies
}

type copies struct {
	row testenv.Row
	n   int
}

func newModel(desc map[string]*testenv.Table) *model {
	m := &model{desc: desc, rows: map[string]map[string]*copies{}}
	for name := range desc {
		m.rows[name] = map[string]*copies{}
	}
	return m
}

// add adds n (negative: removes) copies of row to table; removing a row the model does
// not hold is an error.
func (m *model) add(table string, row testenv.Row, n int) error {
	line := m.desc[table].Line(row)
	c := m.rows[table][line]
	if c == nil {
		c = &copies{row: row}
		m.rows[table][line] = c
	}
	if c.n+n < 0 {
		return fmt.Errorf("row %s is not in the replayed state", line)
	}
	c.n += n
	if c.n == 0 {
		delete(m.rows[table], line)
	}
	return nil
}

// hasKey reports whether a keyed table holds a row with row's key.
func (m *model) hasKey(table string, row testenv.Row) bool {
	d := m.desc[table]
	if len(d.Key) == 0 {
		return false
	}
	k := d.KeyOf(row)
	for _, c := range m.rows[table] {
		if d.KeyOf(c.row) == k {
			return true
		}
	}
	return false
}

// table returns every row of table, each copy once.
func (m *model) table(table string) []testenv.Row {
	var out []testenv.Row
	for _, c := range m.rows[table] {
		for range c.n {
			out = append(out, c.row)
		}
	}
	return out
}

// openTiDB opens TiDB for the test's reads with the generator's session time zone (the
// text of TIMESTAMP values depends on it).
func openTiDB(t *testing.T, cfg Config) *sql.DB {
	t.Helper()
	dsn, err := sessionDSN(cfg.Upstream, "", cfg.TimeZone, true)
	if err != nil {
		t.Fatal(err)
	}
	db, err := openDB(dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// describeTables describes the generated tables as TiDB has them now.
func describeTables(t *testing.T, ctx context.Context, tidb *sql.DB, db string, tables []string) map[string]*testenv.Table {
	t.Helper()
	out := map[string]*testenv.Table{}
	for _, name := range tables {
		d, err := testenv.DescribeTable(ctx, tidb, db, name)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = d
	}
	return out
}

// tidbRows reads every row of the described tables from TiDB at ts.
func tidbRows(t *testing.T, ctx context.Context, tidb *sql.DB, desc map[string]*testenv.Table, ts uint64) map[string][]testenv.Row {
	t.Helper()
	var db string
	for _, d := range desc {
		db = d.Schema
	}
	conn, done, err := testenv.Side{Label: "TiDB", DB: tidb, Schema: db, TS: ts}.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	out := map[string][]testenv.Row{}
	for name, d := range desc {
		if out[name], err = testenv.ReadRows(ctx, conn, d); err != nil {
			t.Fatalf("TiDB at ts %d: %v", ts, err)
		}
	}
	return out
}

// diffModel fails the test when the replayed state differs from TiDB at ts, naming up to
// five differences (table, key, column, both values).
func diffModel(t *testing.T, what string, m *model, tidb map[string][]testenv.Row, ts uint64) {
	t.Helper()
	n := 0
	for _, name := range slices.Sorted(maps.Keys(m.desc)) {
		for _, d := range testenv.DiffRows(m.desc[name], "TiDB at ts "+strconv.FormatUint(ts, 10), "the replayed events", tidb[name], m.table(name)) {
			if n < 5 {
				t.Errorf("%s: %s", what, d)
			}
			n++
		}
	}
	if n > 0 {
		t.Fatalf("%s: %d differences", what, n)
	}
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
		{"index-value dispatcher, split pk updates, images checked", func(c *Config) {
			c.Dispatcher = DispatchIndexValue
			c.CheckImages = true
		}},
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
			tidb := openTiDB(t, cfg)
			desc := describeTables(t, ctx, tidb, up.Name, tables)
			st := newModel(desc)
			if cfg.ImportRows > 0 {
				// The import copied TiDB at the start ts to the downstream, server to server.
				down, err := openDB(testenv.DSN(t, testenv.EnvDownstream, up.Name, map[string]string{"time_zone": "'" + cfg.TimeZone + "'"}), 1)
				if err != nil {
					t.Fatal(err)
				}
				defer down.Close()
				testenv.AssertSame(t, ctx,
					testenv.Side{Label: "TiDB", DB: tidb, Schema: up.Name, TS: res.StartTs},
					testenv.Side{Label: "the imported downstream", DB: down, Schema: up.Name},
					testenv.Options{Tables: tables})
				for name, rows := range tidbRows(t, ctx, tidb, desc, res.StartTs) {
					for _, r := range rows {
						if err := st.add(name, r, 1); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			image := func(ev open.Event, cols []open.Column) testenv.Row {
				t.Helper()
				r, err := modelRow(desc[ev.Table], cols)
				if err != nil {
					t.Fatalf("%s of %s at ts %d: %v", ev.Op, ev.Table, ev.CommitTs, err)
				}
				return r
			}
			checkpoints := []uint64{resolvedSeen[len(resolvedSeen)/3], resolvedSeen[2*len(resolvedSeen)/3], res.ResolvedTs}
			i := 0
			for _, cp := range checkpoints {
				for ; i < len(rows) && rows[i].CommitTs <= cp; i++ {
					ev := rows[i]
					if desc[ev.Table] == nil {
						t.Fatalf("row of table %s, which the generator does not own", ev.Table)
					}
					switch ev.Op {
					case open.OpInsert:
						r := image(ev, ev.Columns)
						if st.hasKey(ev.Table, r) {
							t.Fatalf("insert into %s at ts %d: key %s already present", ev.Table, ev.CommitTs, desc[ev.Table].KeyOf(r))
						}
						_ = st.add(ev.Table, r, 1)
					case open.OpUpdate, open.OpDelete:
						old := ev.Columns
						if ev.Op == open.OpUpdate {
							old = ev.OldColumns
						}
						if err := st.add(ev.Table, image(ev, old), -1); err != nil {
							t.Fatalf("%s of %s at ts %d: old %v", ev.Op, ev.Table, ev.CommitTs, err)
						}
						if ev.Op == open.OpUpdate {
							_ = st.add(ev.Table, image(ev, ev.Columns), 1)
						}
					}
				}
				diffModel(t, fmt.Sprintf("at resolved ts %d", cp), st, tidbRows(t, ctx, tidb, desc, cp), cp)
			}
		})
	}
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

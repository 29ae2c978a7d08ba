package e2e

// corpus_story_test.go reads ../shared/ticdc-corpus as expected.json describes it
// (replayCorpus) and composes its records into the stories TestCorpusReplay replays: the
// order a changefeed sends them in (DDL first, rows by commit ts, resolved events after),
// the classic and new-architecture variants, the compression stories and the race rounds.

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/internal/corpus"
)

// ---- the corpus, as expected.json describes it ----

type replayCorpus struct {
	t     *testing.T
	dir   string
	cases map[string]*replayCase
}

type replayCase struct {
	Name     string
	Dir      string
	Messages []struct {
		KeyFile   string        `json:"key_file"`
		ValueFile string        `json:"value_file"`
		Events    []replayEvent `json:"events"`
	} `json:"messages"`
}

// replayEvent is an event as expected.json gives it: what TiCDC's encoder was handed.
type replayEvent struct {
	Kind          string      `json:"kind"`
	ResolvedTs    json.Number `json:"resolved_ts"`
	CommitTs      json.Number `json:"commit_ts"`
	Schema        string      `json:"schema"`
	Table         string      `json:"table"`
	DDLType       int         `json:"ddl_type"`
	Query         string      `json:"query"`
	RowKind       string      `json:"row_kind"`
	OnlyHandleKey bool        `json:"only_handle_key"`
	Columns       []replayCol `json:"columns"`
	PreColumns    []replayCol `json:"pre_columns"`
}

type replayCol struct {
	Name          string          `json:"name"`
	MySQLType     int             `json:"mysql_type"`
	Flags         uint64          `json:"flags"`
	Value         json.RawMessage `json:"value"`
	ValueEncoding string          `json:"value_encoding"`
	Generated     string          `json:"generated"` // "VIRTUAL AS (…)", "STORED AS (…)"
}

// virtual reports a VIRTUAL generated column: the mounters leave its value out (the
// newarch one hands the encoder a nil), the fallback computes it.
func (c *replayCol) virtual() bool { return strings.HasPrefix(c.Generated, "VIRTUAL") }

func (e *replayEvent) ts() uint64 {
	s := e.CommitTs
	if e.Kind == "resolved" {
		s = e.ResolvedTs
	}
	v, err := strconv.ParseUint(string(s), 10, 64)
	if err != nil {
		panic(fmt.Sprintf("expected.json: ts %q: %v", s, err))
	}
	return v
}

func loadReplayCorpus(t *testing.T) *replayCorpus {
	t.Helper()
	root, cases := corpus.Load(t, func(name, dir string) *replayCase { return &replayCase{Name: name, Dir: dir} })
	c := &replayCorpus{t: t, dir: root, cases: map[string]*replayCase{}}
	for _, rc := range cases {
		c.cases[rc.Name] = rc
	}
	if len(c.cases) == 0 {
		t.Fatalf("no cases in %s", root)
	}
	return c
}

func (c *replayCorpus) get(name string) *replayCase {
	rc, ok := c.cases[name]
	if !ok {
		c.t.Fatalf("corpus case %s not found in %s", name, c.dir)
	}
	return rc
}

// ---- stories: the records in the order a changefeed sends them ----

// replayRecord is one Kafka record of a story.
type replayRecord struct {
	key, value []byte
	broadcast  bool          // DDL and resolved: to every partition, as TiCDC does
	table      string        // rows: "schema.table", which picks the partition
	events     []replayEvent // for the model, in the record's order
	from       string        // corpus case (and message) it came from
}

// replayStory is a changefeed's records in send order. Its builders check the order
// is one TiCDC could produce: commit ts never decreasing, every row and DDL above the
// resolved ts already sent.
type replayStory struct {
	c        *replayCorpus
	newarch  bool
	recs     []replayRecord
	resolved uint64 // the last resolved ts sent
	last     uint64 // the largest commit ts sent
}

func (c *replayCorpus) story(newarch bool) *replayStory {
	return &replayStory{c: c, newarch: newarch}
}

// add appends every record of the named cases.
func (s *replayStory) add(names ...string) *replayStory {
	for _, name := range names {
		rc := s.c.get(name)
		for i := range rc.Messages {
			s.addMessage(name, i)
		}
	}
	return s
}

// addMessage appends the i-th record of a case.
func (s *replayStory) addMessage(name string, i int) *replayStory {
	rc := s.c.get(name)
	m := rc.Messages[i]
	if strings.HasPrefix(name, "newarch-") != s.newarch {
		s.c.t.Fatalf("story: %s does not belong in a %s changefeed", name, map[bool]string{false: "classic", true: "newarch"}[s.newarch])
	}
	key, err := os.ReadFile(filepath.Join(rc.Dir, m.KeyFile))
	if err != nil {
		s.c.t.Fatal(err)
	}
	value, err := os.ReadFile(filepath.Join(rc.Dir, m.ValueFile))
	if err != nil {
		s.c.t.Fatal(err)
	}
	from := name
	if len(rc.Messages) > 1 {
		from = fmt.Sprintf("%s[%d]", name, i)
	}
	s.push(replayRecord{key: key, value: value, events: m.Events, from: from})
	return s
}

func (s *replayStory) push(r replayRecord) {
	t := s.c.t
	if len(r.events) == 0 {
		t.Fatalf("story: %s holds no event", r.from)
	}
	for _, ev := range r.events {
		ts := ev.ts()
		switch ev.Kind {
		case "resolved":
			if ts < s.resolved {
				t.Fatalf("story: resolved ts %d of %s is below the resolved ts %d already sent", ts, r.from, s.resolved)
			}
			s.resolved = ts
			r.broadcast = true
		case "ddl", "row":
			if ts <= s.resolved || ts < s.last {
				t.Fatalf("story: %s (commit ts %d) comes after resolved ts %d and commit ts %d", r.from, ts, s.resolved, s.last)
			}
			s.last = ts
			if ev.Kind == "ddl" {
				r.broadcast = true
			} else {
				if ev.OnlyHandleKey && ev.RowKind != "delete" {
					t.Fatalf("story: %s is a handle-key-only %s, which needs the upstream TiDB", r.from, ev.RowKind)
				}
				tbl := ev.Schema + "." + ev.Table
				if r.table != "" && r.table != tbl {
					t.Fatalf("story: %s holds rows of %s and %s", r.from, r.table, tbl)
				}
				r.table = tbl
			}
		default:
			t.Fatalf("story: %s: unknown event kind %q", r.from, ev.Kind)
		}
	}
	s.recs = append(s.recs, r)
}

// resolvedAt appends a resolved event at ts, as TiCDC broadcasts its checkpoint: the
// corpus's own resolved record of this flavour with the ts of its key replaced.
func (s *replayStory) resolvedAt(ts uint64) *replayStory {
	tmpl := "resolved-01-single"
	if s.newarch {
		tmpl = "newarch-resolved-01"
	}
	rc := s.c.get(tmpl)
	key, err := os.ReadFile(filepath.Join(rc.Dir, rc.Messages[0].KeyFile))
	if err != nil {
		s.c.t.Fatal(err)
	}
	value, err := os.ReadFile(filepath.Join(rc.Dir, rc.Messages[0].ValueFile))
	if err != nil {
		s.c.t.Fatal(err)
	}
	ev := rc.Messages[0].Events[0]
	ev.ResolvedTs = json.Number(strconv.FormatUint(ts, 10))
	s.push(replayRecord{key: restampKey(s.c.t, key, ts), value: value, events: []replayEvent{ev}, from: fmt.Sprintf("resolved %d", ts)})
	return s
}

// resolvedNow appends a resolved event at the largest commit ts sent so far.
func (s *replayStory) resolvedNow() *replayStory { return s.resolvedAt(s.last) }

// ddl appends DDL cases, each followed by the checkpoint TiCDC sends after a DDL (its
// commit ts; resolved-04-after-ddl shows it).
func (s *replayStory) ddl(names ...string) *replayStory {
	for _, n := range names {
		s.add(n).resolvedNow()
	}
	return s
}

// again appends a one-event row record of a case with its commit ts replaced by ts (in
// the key; the value, which carries no ts, is unchanged): the same change made again by
// a later transaction.
func (s *replayStory) again(name string, ts uint64) *replayStory {
	rc := s.c.get(name)
	if len(rc.Messages) != 1 || len(rc.Messages[0].Events) != 1 || rc.Messages[0].Events[0].Kind != "row" {
		s.c.t.Fatalf("story: %s is not a single row event", name)
	}
	key, err := os.ReadFile(filepath.Join(rc.Dir, rc.Messages[0].KeyFile))
	if err != nil {
		s.c.t.Fatal(err)
	}
	value, err := os.ReadFile(filepath.Join(rc.Dir, rc.Messages[0].ValueFile))
	if err != nil {
		s.c.t.Fatal(err)
	}
	ev := rc.Messages[0].Events[0]
	ev.CommitTs = json.Number(strconv.FormatUint(ts, 10))
	s.push(replayRecord{key: restampKey(s.c.t, key, ts), value: value, events: []replayEvent{ev}, from: fmt.Sprintf("%s at ts %d", name, ts)})
	return s
}

var keyTsRe = regexp.MustCompile(`"ts":\d+`)

// restampKey returns an open-protocol key (version, then one length-prefixed JSON key)
// with its "ts" replaced.
func restampKey(t *testing.T, key []byte, ts uint64) []byte {
	t.Helper()
	if len(key) < 16 || binary.BigEndian.Uint64(key) != 1 {
		t.Fatalf("restamp: not an open-protocol key: %x", key)
	}
	n := binary.BigEndian.Uint64(key[8:16])
	if uint64(len(key)-16) != n {
		t.Fatalf("restamp: key holds more than one event (%d bytes, first %d)", len(key)-16, n)
	}
	js := key[16:]
	if len(keyTsRe.FindAllIndex(js, -1)) != 1 {
		t.Fatalf("restamp: key %s has no single ts", js)
	}
	js = keyTsRe.ReplaceAll(js, []byte(`"ts":`+strconv.FormatUint(ts, 10)))
	out := make([]byte, 16, 16+len(js))
	binary.BigEndian.PutUint64(out, 1)
	binary.BigEndian.PutUint64(out[8:], uint64(len(js)))
	return append(out, js...)
}

// messages turns the story into Kafka messages for a topic of n partitions: DDL and
// resolved records to every partition, rows to their table's partition (TiCDC's table
// dispatcher: one table, one partition).
func (s *replayStory) messages(n int) []kafka.Message {
	var out []kafka.Message
	for _, r := range s.recs {
		if r.broadcast {
			for p := range n {
				out = append(out, kafka.Message{Partition: p, Key: r.key, Value: r.value})
			}
			continue
		}
		p := int(crc32.ChecksumIEEE([]byte(r.table)) % uint32(n))
		out = append(out, kafka.Message{Partition: p, Key: r.key, Value: r.value})
	}
	return out
}

// The classic story's variants: which of the corpus's encodings of the insert of id=5,
// the update of id=1 and the delete of id=5 a changefeed sends.
type classicVariant struct{ insert5, update1, delete5 string }

var (
	// A full insert, then the delete with only the handle key in the same round.
	classicVariant1 = classicVariant{"row-all-types-05-insert-escapes-binary", "row-all-types-07-update", "row-all-types-12-delete-only-handle-key"}
	// The insert through claim-check, then a handle-key-only (large message) delete.
	classicVariant2 = classicVariant{"large-05-claim-check-insert", "row-all-types-08-update-only-updated-columns", "large-03-handle-key-only-delete"}
	// A full delete; the update without its old value.
	classicVariant3 = classicVariant{"row-all-types-05-insert-escapes-binary", "row-all-types-09-update-no-old-value", "row-all-types-11-delete"}
)

// classicStory is the classic corpus as one changefeed, in generation (commit-ts) order.
func (c *replayCorpus) classicStory(v classicVariant) *replayStory {
	s := c.story(false)
	s.add("resolved-01-single", "resolved-02-sequence")
	s.ddl("ddl-01-create-database", "ddl-02-create-table-all-types", "ddl-03-create-table-composite-pk",
		"ddl-04-create-table-composite-pk-nonclustered", "ddl-05-create-table-unique-key-only",
		"ddl-06-create-table-no-key", "ddl-07-create-table-partitioned", "ddl-08-create-table-generated-columns",
		"ddl-09-create-table-batch")
	// Inserts of id=1..6, updates, and the delete of id=5: one round (no resolved event
	// between the insert of id=5 and its delete).
	s.add("row-all-types-01-insert-typical", "row-all-types-02-insert-max", "row-all-types-03-insert-min-empty",
		"row-all-types-04-insert-nulls", v.insert5, "row-all-types-06-insert-zero-temporal", v.update1,
		"row-all-types-10-update-from-null", v.delete5).resolvedNow()
	s.add("row-all-types-13-update-pk-change").resolvedNow()
	s.add("row-composite-pk-01-insert", "row-composite-pk-02-update", "row-composite-pk-03-delete",
		"row-composite-pk-nonclustered-01-insert").resolvedNow()
	s.add("row-unique-key-only-01-insert", "row-unique-key-only-02-update", "row-unique-key-only-03-delete").resolvedNow()
	s.add("row-no-key-01-insert", "row-no-key-02-update", "row-no-key-03-delete").resolvedNow()
	s.add("row-partition-01-insert", "row-generated-columns-01-insert").resolvedNow()
	s.add("batch-01-default-max-batch-size-16", "batch-02-max-batch-size-1", "batch-03-mixed-insert-update-delete").resolvedNow()
	s.add("large-04-handle-key-only-small-message-unchanged").resolvedNow()
	s.ddl("ddl-10-alter-table-add-column")
	s.add("row-unique-key-only-04-insert-after-add-column", "row-unique-key-only-05-update-row-written-before-add-column").resolvedNow()
	s.ddl("ddl-11-truncate-table", "ddl-12-rename-table")
	s.add("ddl-13-rename-tables-multi").resolvedNow()
	s.ddl("ddl-14-drop-table", "ddl-15-add-index")
	// ddl-16 drops corpus_tmp, created before the corpus's window (the run creates it
	// downstream first); resolved-04 is TiCDC's checkpoint right after it.
	s.add("ddl-16-drop-database", "resolved-04-after-ddl")
	return s
}

// classicCompressionSetup creates, uncompressed, the schema and the tables the
// compression cases write to (the corpus has no compressed CREATE for them).
func (c *replayCorpus) classicCompressionSetup() *replayStory {
	return c.story(false).ddl("ddl-01-create-database", "ddl-02-create-table-all-types", "ddl-09-create-table-batch")
}

// classicCompressionStory is a changefeed with large-message-handle-compression = comp.
func (c *replayCorpus) classicCompressionStory(comp string) *replayStory {
	p := "compression-" + comp + "-"
	s := c.story(false)
	s.ddl(p + "03-ddl")
	s.add(p+"01-row-insert", p+"02-row-batch", p+"04-resolved")
	return s
}

type newarchVariant struct{ insert5, update1, delete5, batch string }

var (
	newarchVariant1 = newarchVariant{"newarch-row-all-types-05-insert-escapes-binary", "newarch-row-all-types-07-update",
		"newarch-row-all-types-12-delete-only-handle-key", "newarch-batch-01-default-max-batch-size-16"}
	newarchVariant2 = newarchVariant{"newarch-large-05-claim-check-insert", "newarch-row-all-types-08-update-only-updated-columns",
		"newarch-row-all-types-11-delete", "newarch-batch-02-max-batch-size-1"}
	newarchVariant3 = newarchVariant{"newarch-row-all-types-05-insert-escapes-binary", "newarch-row-all-types-09-update-no-old-value",
		"newarch-row-all-types-12-delete-only-handle-key", "newarch-batch-01-default-max-batch-size-16"}
)

// newarchSetup creates the tables the newarch cases write to but whose CREATE TABLE the
// newarch subset lacks (uk_only, no_key, part_t, gen_cols, batch_t), with the classic
// records of the same DDL — in a changefeed of their own, as the two sets' commit ts
// overlap. The newarch story's own CREATE DATABASE then finds the schema there.
func (c *replayCorpus) newarchSetup() *replayStory {
	return c.story(false).ddl("ddl-01-create-database", "ddl-05-create-table-unique-key-only", "ddl-06-create-table-no-key",
		"ddl-07-create-table-partitioned", "ddl-08-create-table-generated-columns", "ddl-09-create-table-batch")
}

// newarchStory is the new-architecture corpus as one changefeed, in commit-ts order.
func (c *replayCorpus) newarchStory(v newarchVariant) *replayStory {
	s := c.story(true)
	s.addMessage("newarch-resolved-01", 0).addMessage("newarch-resolved-01", 1)
	s.ddl("newarch-ddl-01-create-database", "newarch-ddl-02-create-table-all-types", "newarch-ddl-03-create-table-composite-pk")
	s.add("newarch-row-all-types-01-insert-typical", "newarch-row-all-types-02-insert-max",
		"newarch-row-all-types-03-insert-min-empty", "newarch-row-all-types-04-insert-nulls", v.insert5, v.update1,
		"newarch-row-all-types-10-update-from-null", v.delete5).resolvedNow()
	s.add("newarch-row-composite-pk-01-insert", "newarch-row-unique-key-only-01-insert",
		"newarch-row-unique-key-only-02-update").resolvedNow()
	s.add("newarch-row-no-key-01-insert", "newarch-row-no-key-02-update").resolvedNow()
	s.add("newarch-row-partition-01-insert", "newarch-row-generated-columns-01-insert").resolvedNow()
	s.add(v.batch).resolvedNow()
	s.ddl("newarch-ddl-10-alter-table-add-column")
	s.add("newarch-row-unique-key-only-05-update-row-written-before-add-column").resolvedNow()
	s.ddl("newarch-ddl-11-truncate-table")
	return s
}

func (c *replayCorpus) newarchCompressionSetup() *replayStory {
	s := c.story(true)
	s.ddl("newarch-ddl-01-create-database", "newarch-ddl-02-create-table-all-types")
	return s
}

func (c *replayCorpus) newarchCompressionStory(comp string) *replayStory {
	s := c.story(true)
	s.add("newarch-compression-" + comp + "-01-row-insert").resolvedNow()
	return s
}

// The race rounds: each round inserts id=5 and deletes it again, twice, in one round.
var (
	classicRaceCycles = [][2]string{
		{"row-all-types-05-insert-escapes-binary", "row-all-types-12-delete-only-handle-key"},
		{"row-all-types-05-insert-escapes-binary", "large-03-handle-key-only-delete"},
	}
	newarchRaceCycles = [][2]string{
		{"newarch-row-all-types-05-insert-escapes-binary", "newarch-row-all-types-12-delete-only-handle-key"},
		{"newarch-row-all-types-05-insert-escapes-binary", "newarch-row-all-types-12-delete-only-handle-key"},
	}
)

package e2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/upstream"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestCollationKeys is issue 24's end-to-end test: keys that are equal under their
// column's collation but spelled with other bytes ('ase', 'ASE', 'Asé', 'ase ') are one
// key, and parity serve must apply their changes as TiDB made them.
//
// Tables with utf8mb4_general_ci, utf8mb4_unicode_ci and PAD SPACE utf8mb4_bin string
// primary keys (clustered, keyed in TiDB's storage by the collation key, and
// non-clustered, keyed by _tidb_rowid), a composite (INT, VARCHAR _ci) key and a _ci
// UNIQUE secondary key are created on TiDB; the changefeed carries their CREATE TABLE.
// One TiDB session then respells keys by case, accent and trailing spaces, several
// times inside one transaction and across adjacent ones, deletes and re-inserts
// respelled keys, swaps keys between rows through a temporary key, and moves unique
// values between rows. Every committed transaction becomes the events TiCDC's Kafka
// sink would send: one per changed row (TiCDC sees a transaction's net change of each
// storage key), full images with TiCDC's types and flags, an update that changes a
// primary- or unique-key value split into a delete and an insert with the deletes
// first (output-raw-change-event = false), its real commit ts, encoded by cdc/open,
// dispatched over 3 partitions by table for some tables and by index value for others
// (TiCDC's per-table [[sink.dispatchers]]), and a resolved ts after every 2-5
// transactions — so one applier round holds several spellings of one key. parity serve
// applies them with 6 workers and batches of 3 rows; then every table on the fallback
// must equal TiDB at the last commit ts, every column compared as HEX bytes.
//
// PARITY_COLLATION_REPS (default 50) repeats the pattern set; PARITY_COLLATION_SEED
// (default 24) seeds the workload's choices.
func TestCollationKeys(t *testing.T) {
	reps := collEnvInt(t, "PARITY_COLLATION_REPS", 50)
	seed := uint64(collEnvInt(t, "PARITY_COLLATION_SEED", 24))
	e := newEnv(t, 3, true)
	e.writeConfig("", "workers = 6\nbatch-rows = 3\n")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	up := openCollSession(t, e.upDSN, e.db)
	down := e.open(e.downDSN, e.db)
	var eq int
	if err := up.QueryRowContext(ctx, "SELECT 'a' = 'A' COLLATE utf8mb4_general_ci").Scan(&eq); err != nil || eq != 1 {
		t.Fatalf("TiDB must run with new collations ('a' = 'A' COLLATE utf8mb4_general_ci gave %d, %v)", eq, err)
	}
	r := rand.New(rand.NewPCG(seed, 24))
	tables := collTables(r)
	for _, ct := range tables {
		collCheckSpellings(t, ctx, "TiDB", up, ct)
		collCheckSpellings(t, ctx, "fallback", down, ct)
	}

	pub := newCollPublisher(t, e, tables)
	for _, ct := range tables {
		if _, err := up.ExecContext(ctx, ct.ddl); err != nil {
			t.Fatalf("create table %s on TiDB: %v", ct.name, err)
		}
		meta, err := upstream.LoadTable(ctx, up, e.db, ct.name)
		if err != nil {
			t.Fatal(err)
		}
		ct.meta = meta
		pub.send(collBatch{ddl: &open.Event{Kind: open.KindDDL, CommitTs: testenv.TiDBTSO(t, up), Schema: e.db,
			Table: ct.name, Query: ct.ddl, DDLType: 3}})
	}
	pub.send(collBatch{resolved: testenv.TiDBTSO(t, up)})
	s := e.startServe()

	conn, err := up.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w := &collWorkload{t: t, ctx: ctx, conn: conn, r: r, pub: pub, schema: e.db}
	start := time.Now()
	checks := 0
	for rep := 0; rep < reps; rep++ {
		for _, ct := range tables {
			w.rounds(ct)
		}
		// A lost row is healed by the next insert of its key: compare every few
		// repetitions, once serve has applied all of them (nothing newer is published
		// yet, so the fallback is exactly at lastTs).
		if (rep+1)%collCheckEvery == 0 || rep == reps-1 {
			if err := pub.failed(); err != nil {
				t.Fatalf("publish: %v", err)
			}
			e.waitApplied(s, w.lastTs, time.Minute)
			compareCollTables(t, ctx, up, down, e.db, tables, w.lastTs)
			checks++
			if t.Failed() {
				t.Fatalf("the fallback differs from TiDB after repetition %d of %d (%d transactions, %d rounds so far)",
					rep+1, reps, w.txns, w.roundsDone)
			}
		}
	}
	if err := pub.close(); err != nil {
		t.Fatalf("publish: %v", err)
	}
	t.Logf("workload: %d transactions, %d row events, %d rounds in %v; %d key respellings split into delete + insert, "+
		"%d rounds deleting and inserting one key under two spellings; the fallback equalled TiDB at %d checkpoints, the last at ts %d",
		w.txns, w.events, w.roundsDone, time.Since(start).Round(time.Millisecond), w.respelled, w.collisions, checks, w.lastTs)
	if w.respelled < reps || w.collisions < reps {
		t.Fatalf("the workload respelled too few keys (%d respellings, %d colliding rounds for %d repetitions): it no longer exercises the issue",
			w.respelled, w.collisions, reps)
	}
	s.stop(t)
}

// collCheckEvery is how many repetitions run between two comparisons.
const collCheckEvery = 5

func collEnvInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// openCollSession opens TiDB as the workload uses it: pessimistic transactions whose
// commit ts comes from the TSO (as loadgen's sessions), parameters interpolated.
func openCollSession(t *testing.T, dsn, db string) *sql.DB {
	t.Helper()
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c.DBName = db
	c.InterpolateParams = true
	c.ParseTime = false
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["time_zone"] = "'+00:00'"
	c.Params["tidb_txn_mode"] = "'pessimistic'"
	c.Params["tidb_enable_async_commit"] = "0"
	c.Params["tidb_enable_1pc"] = "0"
	sdb, err := sql.Open("mysql", c.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	sdb.SetMaxOpenConns(4)
	t.Cleanup(func() { sdb.Close() })
	return sdb
}

// collTable is one table of the test and the workload's model of its rows.
type collTable struct {
	name string
	ddl  string
	coll string // collation of the string key column
	// dispatch is the table's partition rule ([[sink.dispatchers]] partition).
	dispatch string
	// keyCols are the primary-key columns; the key column `k` (or `u`) is a string.
	keyCols []string
	// identity is the SQL expression of a row's key in TiDB's storage: the unit TiCDC
	// sees changed once per transaction. Clustered string keys are stored under their
	// collation key (WEIGHT_STRING), non-clustered tables under _tidb_rowid.
	identity string
	rowid    bool // identity is _tidb_rowid (TiCDC's "rid")
	unique   bool // INT primary key `id`, the string is the UNIQUE column `u`
	grouped  bool // composite key (g, k)
	// families are the spellings of the keys; all spellings of a family are equal
	// under coll, different families are not.
	families [][]string
	meta     *upstream.Table

	// history lists the events sent for each key (by familyKey), for failure messages.
	history map[string][]string

	present map[collSlot]bool // key tables: which keys hold a row
	holds   map[int64]int     // unique table: id -> family of its u, or -1 for its own "free" value
	nextID  int64
}

// collSlot is one key of a key table: family fam, in group g of a composite key.
type collSlot struct{ g, fam int }

const collTmpKey = "~tmp" // the temporary key of a swap

func collTables(r *rand.Rand) []*collTable {
	ci := func() [][]string {
		return [][]string{collCISpellings(r, "ase"), collCISpellings(r, "ole"), collCISpellings(r, "uni")}
	}
	// Under utf8mb4_bin only trailing spaces respell a key; case and accents make
	// other keys.
	bin := [][]string{collPadSpellings("ase"), collPadSpellings("Ase"), collPadSpellings("asé")}
	keyTable := func(name, coll, clustered, dispatch string, fam [][]string) *collTable {
		ct := &collTable{
			name: name, coll: coll, dispatch: dispatch, keyCols: []string{"k"}, families: fam,
			ddl: "CREATE TABLE " + ident.Quote(name) + " (\n" +
				"  `k` VARCHAR(32) CHARACTER SET utf8mb4 COLLATE " + coll + " NOT NULL,\n" +
				"  `v` BIGINT NOT NULL,\n" +
				"  `note` VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n" +
				"  PRIMARY KEY (`k`) /*T![clustered_index] " + clustered + " */\n" +
				") DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
		}
		if clustered == "CLUSTERED" {
			ct.identity = "HEX(WEIGHT_STRING(`k`))"
		} else {
			ct.identity, ct.rowid = "_tidb_rowid", true
		}
		return ct
	}
	comp := &collTable{
		name: "comp", coll: "utf8mb4_general_ci", dispatch: loadgen.DispatchTable, keyCols: []string{"g", "k"}, grouped: true,
		families: [][]string{collCISpellings(r, "ase"), collCISpellings(r, "ole")},
		identity: "CONCAT(`g`, ',', HEX(WEIGHT_STRING(`k`)))",
		ddl: "CREATE TABLE `comp` (\n" +
			"  `g` INT NOT NULL,\n" +
			"  `k` VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL,\n" +
			"  `v` BIGINT NOT NULL,\n" +
			"  `note` VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n" +
			"  PRIMARY KEY (`g`, `k`) /*T![clustered_index] CLUSTERED */\n" +
			") DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
	}
	uk := &collTable{
		name: "uk", coll: "utf8mb4_general_ci", dispatch: loadgen.DispatchIndexValue, keyCols: []string{"id"}, unique: true,
		families: ci(), identity: "`id`",
		ddl: "CREATE TABLE `uk` (\n" +
			"  `id` INT NOT NULL,\n" +
			"  `u` VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL,\n" +
			"  `v` BIGINT NOT NULL,\n" +
			"  PRIMARY KEY (`id`) /*T![clustered_index] CLUSTERED */,\n" +
			"  UNIQUE KEY `u` (`u`)\n" +
			") DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
	}
	// Each collation's key is dispatched by table (a table's rows in one partition, in
	// TiCDC's order) and by index value (a split update's delete and insert of two
	// spellings land in different partitions, so only their commit ts orders them).
	tbl, iv := loadgen.DispatchTable, loadgen.DispatchIndexValue
	out := []*collTable{
		keyTable("gci", "utf8mb4_general_ci", "CLUSTERED", tbl, ci()),
		keyTable("gci_rowid", "utf8mb4_general_ci", "NONCLUSTERED", iv, ci()),
		keyTable("uci", "utf8mb4_unicode_ci", "CLUSTERED", iv, ci()),
		keyTable("uci_rowid", "utf8mb4_unicode_ci", "NONCLUSTERED", tbl, ci()),
		keyTable("bin", "utf8mb4_bin", "NONCLUSTERED", tbl, bin),
		keyTable("bin_iv", "utf8mb4_bin", "CLUSTERED", iv, bin),
		comp,
		uk,
	}
	for _, ct := range out {
		ct.present = map[collSlot]bool{}
		ct.holds = map[int64]int{}
		ct.history = map[string][]string{}
	}
	return out
}

// collAccents are spellings equal to a vowel under utf8mb4_general_ci and _unicode_ci, on
// TiDB and on MariaDB (collCheckSpellings verifies it on both).
var collAccents = map[rune][]rune{
	'a': []rune("áàâäÁÀÂÄ"), 'e': []rune("éèêëÉÈÊË"), 'i': []rune("íìîïÍÌÎÏ"),
	'o': []rune("óòôöÓÒÔÖ"), 'u': []rune("úùûüÚÙÛÜ"),
}

// collCISpellings returns about a dozen spellings of base under a _ci collation: the word
// itself, upper case, and random mixes of case, collAccents and trailing spaces.
func collCISpellings(r *rand.Rand, base string) []string {
	out := []string{base, strings.ToUpper(base), strings.ToUpper(base[:1]) + base[1:], base + " "}
	for len(out) < 12 {
		var b strings.Builder
		for _, c := range base {
			switch x := r.IntN(3); {
			case x == 0 && collAccents[c] != nil:
				b.WriteRune(collAccents[c][r.IntN(len(collAccents[c]))])
			case x == 1:
				b.WriteRune(unicode.ToUpper(c))
			default:
				b.WriteRune(c)
			}
		}
		b.WriteString(strings.Repeat(" ", r.IntN(3)))
		if s := b.String(); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func collPadSpellings(base string) []string {
	return []string{base, base + " ", base + "  ", base + "   "}
}

// collCheckSpellings proves the test's premise on one server: the spellings of a family
// are equal under the table's collation, different families are not.
func collCheckSpellings(t *testing.T, ctx context.Context, server string, db *sql.DB, ct *collTable) {
	t.Helper()
	var exprs []string
	var args []any
	var what []string
	for i, fam := range ct.families {
		for _, sp := range fam[1:] {
			exprs = append(exprs, "CONVERT(? USING utf8mb4) COLLATE "+ct.coll+" = CONVERT(? USING utf8mb4)")
			args = append(args, fam[0], sp)
			what = append(what, fmt.Sprintf("%q = %q", fam[0], sp))
		}
		for _, other := range ct.families[i+1:] {
			exprs = append(exprs, "CONVERT(? USING utf8mb4) COLLATE "+ct.coll+" <> CONVERT(? USING utf8mb4)")
			args = append(args, fam[0], other[0])
			what = append(what, fmt.Sprintf("%q <> %q", fam[0], other[0]))
		}
	}
	got := make([]int, len(exprs))
	dest := make([]any, len(exprs))
	for i := range got {
		dest[i] = &got[i]
	}
	if err := db.QueryRowContext(ctx, "SELECT "+strings.Join(exprs, ", "), args...).Scan(dest...); err != nil {
		t.Fatalf("%s: check spellings of %s: %v", server, ct.name, err)
	}
	for i, v := range got {
		if v != 1 {
			t.Fatalf("%s: %s is false under %s: the test's spellings do not hold on this server", server, what[i], ct.coll)
		}
	}
}

// collBatch is what the publisher writes next: a DDL, or a round's row events followed
// by a resolved ts, or a resolved ts alone.
type collBatch struct {
	ddl      *open.Event
	rows     []*open.Event
	resolved uint64
}

// collPublisher writes batches to the topic in order, in the background, as TiCDC's
// Kafka sink would: row events dispatched by their table's rule and batched per (partition,
// partition key), DDL and resolved events broadcast to every partition after the rows.
type collPublisher struct {
	e     *env
	w     *kafka.Writer
	disp  map[string]loadgen.Dispatcher // by table
	enc   *open.Encoder
	ch    chan collBatch
	done  chan struct{}
	err   error
	ctx   context.Context
	stopF context.CancelFunc
}

func newCollPublisher(t *testing.T, e *env, tables []*collTable) *collPublisher {
	t.Helper()
	disp := map[string]loadgen.Dispatcher{}
	for _, ct := range tables {
		d, err := loadgen.NewDispatcher(ct.dispatch)
		if err != nil {
			t.Fatal(err)
		}
		disp[ct.name] = d
	}
	enc, err := open.NewEncoder(open.DefaultEncoderConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	p := &collPublisher{
		e: e, disp: disp, enc: enc, ch: make(chan collBatch, 64), done: make(chan struct{}), ctx: ctx, stopF: cancel,
		w: &kafka.Writer{
			Addr:         kafka.TCP(e.broker),
			Topic:        e.topic,
			Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
			BatchTimeout: time.Millisecond,
			RequiredAcks: kafka.RequireAll,
		},
	}
	go p.run()
	t.Cleanup(func() { _ = p.close() })
	return p
}

func (p *collPublisher) send(b collBatch) {
	select {
	case p.ch <- b:
	case <-p.done: // failed; close reports it
	}
}

// failed returns the error that stopped the publisher, if it stopped.
func (p *collPublisher) failed() error {
	select {
	case <-p.done:
		if p.err == nil {
			return errors.New("publisher stopped")
		}
		return p.err
	default:
		return nil
	}
}

// close publishes what was sent and returns the first error.
func (p *collPublisher) close() error {
	select {
	case <-p.done:
	default:
		close(p.ch)
		<-p.done
	}
	p.stopF()
	return p.err
}

func (p *collPublisher) run() {
	defer close(p.done)
	defer p.w.Close()
	for b := range p.ch {
		if err := p.write(b); err != nil {
			p.err = err
			return
		}
	}
}

func (p *collPublisher) write(b collBatch) error {
	broadcast := func(m open.Message) error {
		msgs := make([]kafka.Message, p.e.partitions)
		for i := range msgs {
			msgs[i] = kafka.Message{Partition: i, Key: m.Key, Value: m.Value}
		}
		return writeRetry(p.ctx, p.w, msgs)
	}
	if b.ddl != nil {
		m, err := p.enc.EncodeDDL(b.ddl)
		if err != nil {
			return err
		}
		if err := broadcast(m); err != nil {
			return fmt.Errorf("ddl of %s: %w", b.ddl.Table, err)
		}
	}
	if len(b.rows) > 0 {
		type group struct {
			partition int
			enc       *open.Encoder
		}
		groups := map[string]*group{}
		var order []*group
		for _, ev := range b.rows {
			part, key := p.disp[ev.Table].Dispatch(ev, p.e.partitions)
			gk := strconv.Itoa(part) + "/" + key
			g := groups[gk]
			if g == nil {
				enc, err := open.NewEncoder(open.DefaultEncoderConfig())
				if err != nil {
					return err
				}
				g = &group{partition: part, enc: enc}
				groups[gk] = g
				order = append(order, g)
			}
			if err := g.enc.AppendRow(ev); err != nil {
				return fmt.Errorf("encode %s row at ts %d: %w", ev.Table, ev.CommitTs, err)
			}
		}
		var msgs []kafka.Message
		for _, g := range order {
			for _, m := range g.enc.Build() {
				msgs = append(msgs, kafka.Message{Partition: g.partition, Key: m.Key, Value: m.Value})
			}
		}
		if err := writeRetry(p.ctx, p.w, msgs); err != nil {
			return fmt.Errorf("write %d records: %w", len(msgs), err)
		}
	}
	if b.resolved > 0 {
		if err := broadcast(p.enc.EncodeResolved(b.resolved)); err != nil {
			return fmt.Errorf("resolved ts %d: %w", b.resolved, err)
		}
	}
	return nil
}

// compareCollTables proves every table on the fallback equals TiDB at ts with
// internal/testenv's comparator: the same columns with the same collations, rows matched
// by their primary key's exact bytes, every column's bytes equal, no key lost, added or
// doubled. Each difference is shown with the changefeed's last events of its key.
func compareCollTables(t *testing.T, ctx context.Context, up, down *sql.DB, schema string, tables []*collTable, ts uint64) {
	t.Helper()
	byName := map[string]*collTable{}
	var names []string
	for _, ct := range tables {
		byName[ct.name] = ct
		names = append(names, ct.name)
	}
	rep, err := testenv.CompareSchemas(ctx,
		testenv.Side{Label: "TiDB", DB: up, Schema: schema, TS: ts},
		testenv.Side{Label: "the fallback", DB: down, Schema: schema},
		testenv.Options{Tables: names, Collations: true})
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string]int{}
	for _, d := range rep.Diffs {
		if bad[d.Table] < 10 {
			t.Errorf("%s%s", d, byName[d.Table].lastEvents(d))
		}
		bad[d.Table]++
	}
	for _, tr := range rep.Tables {
		if n := bad[tr.Name]; n > 0 {
			ct := byName[tr.Name]
			t.Errorf("table %s (key collation %s, dispatched by %s): %d differences at ts %d (TiDB %d rows, the fallback %d)",
				ct.name, ct.coll, ct.dispatch, n, ts, tr.RowsA, tr.RowsB)
		}
	}
	if !t.Failed() && testing.Verbose() {
		t.Logf("the fallback equals TiDB at ts %d: %d tables, %d rows, every column byte for byte", ts, len(tables), rep.Rows())
	}
}

// lastEvents renders the last events the changefeed carried for the key of a differing
// row, for a failure message.
func (ct *collTable) lastEvents(d testenv.Diff) string {
	row := d.A
	if row == nil {
		row = d.B
	}
	if row == nil || d.Desc == nil {
		return ""
	}
	cols := make([]open.Column, len(row))
	for i, v := range row {
		c := ct.meta.Columns[ct.meta.Col(d.Desc.Columns[i].Name)]
		cols[i] = open.Column{Name: c.Name, Flags: c.Flags}
		if !v.Null {
			cols[i].Value = v.Text
		}
	}
	fk, _ := ct.familyKey(cols)
	h := ct.history[fk]
	if len(h) > 8 {
		h = h[len(h)-8:]
	}
	return "\n    the changefeed's last events of this key:\n      " + strings.Join(h, "\n      ")
}

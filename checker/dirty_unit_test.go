package checker

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tidb-parity/parity/internal/ledger"
	"github.com/tidb-parity/parity/internal/rowkey"
	"github.com/tidb-parity/parity/internal/tso"
)

func TestParseScope(t *testing.T) {
	at := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want ScopeSpec
		err  string
	}{
		{"", ScopeSpec{Kind: ScopeFull}, ""},
		{"full", ScopeSpec{Kind: ScopeFull}, ""},
		{"cdc", ScopeSpec{Kind: ScopeCDC}, ""},
		{"since:463783849459712000", ScopeSpec{Kind: ScopeSince, Since: 463783849459712000}, ""},
		{"since:2026-01-02T15:04:05Z", ScopeSpec{Kind: ScopeSince, Since: tso.FromTime(at)}, ""},
		{"since:2026-01-02T23:04:05+08:00", ScopeSpec{Kind: ScopeSince, Since: tso.FromTime(at)}, ""},
		{"since:2026-01-02T15:04:05.250Z", ScopeSpec{Kind: ScopeSince, Since: tso.FromTime(at.Add(250 * time.Millisecond))}, ""},
		{"since:1700000000", ScopeSpec{}, "is not a TiDB TSO"},
		{"since:", ScopeSpec{}, "want since:<TSO>"},
		{"since:2026-01-02 15:04:05", ScopeSpec{}, "RFC 3339"},
		{"since:99999999999999999999999", ScopeSpec{}, "out of range"},
		{"Full", ScopeSpec{}, "unknown scope"},
		{"all", ScopeSpec{}, "unknown scope"},
	} {
		got, err := ParseScope(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseScope(%q) = %v, %v; want an error containing %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseScope(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if again, err := ParseScope(got.String()); err != nil || again != got {
			t.Errorf("ParseScope(%q) of %q = %+v, %v", got.String(), c.in, again, err)
		}
	}
}

func TestScopeConfig(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Tables = []string{"s.t"}
	if cfg.Scope != ScopeFull || cfg.CaughtUpLag != 30*time.Second {
		t.Fatalf("defaults: scope %q, caught-up-lag %v", cfg.Scope, cfg.CaughtUpLag)
	}
	cfg.Scope = "cdc"
	cfg.CaughtUpLag = -time.Second
	err := cfg.Validate()
	for _, want := range []string{"changefeed.id: is required with scope cdc", "caught-up-lag: must not be negative"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want %q", err, want)
		}
	}
	cfg.Scope = "since:yesterday"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `scope: scope "since:yesterday"`) {
		t.Errorf("Validate() = %v", err)
	}
	cfg.Scope, cfg.CaughtUpLag, cfg.Changefeed.ID = "cdc", time.Minute, "cf"
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate() = %v", err)
	}
}

func TestEnumMembers(t *testing.T) {
	for _, c := range []struct {
		in        string
		backslash bool
		want      []string
		err       bool
	}{
		{"enum('a','b','c')", false, []string{"a", "b", "c"}, false},
		{"ENUM('a')", false, []string{"a"}, false},
		{"set('x','y','z')", true, []string{"x", "y", "z"}, false},
		// As TiDB spells them: quotes doubled, a backslash as it is.
		{`enum('a','it''s','b\c','x,y','','tab	x')`, false, []string{"a", "it's", `b\c`, "x,y", "", "tab\tx"}, false},
		// As MariaDB spells the same members: backslashes escaped.
		{`enum('a','it''s','b\\c','x,y','','tab	x')`, true, []string{"a", "it's", `b\c`, "x,y", "", "tab\tx"}, false},
		{`enum('it\'s')`, true, []string{"it's"}, false},
		{"enum()", false, nil, true},
		{"enum('a'", false, nil, true},
		{"enum('a','b)", false, nil, true},
		{"enum('a',)", false, nil, true},
		{"enum('a''')x", false, nil, true},
		{"enum(a)", false, nil, true},
		{"varchar(10)", false, nil, true},
		{"enum('a')('b')", false, nil, true},
	} {
		got, err := enumMembers(c.in, c.backslash)
		if (err != nil) != c.err || !reflect.DeepEqual(got, c.want) {
			t.Errorf("enumMembers(%q, %v) = %q, %v", c.in, c.backslash, got, err)
		}
	}
}

// FuzzEnumMembers: the parser never panics, and members written back as a server spells
// them parse to themselves.
func FuzzEnumMembers(f *testing.F) {
	f.Add("enum('a','it''s','b\\\\c')", true)
	f.Add("set('x','y')", false)
	f.Add("enum('')", false)
	f.Fuzz(func(t *testing.T, in string, backslash bool) {
		ms, err := enumMembers(in, backslash)
		if err != nil {
			return
		}
		var b strings.Builder
		b.WriteString("enum(")
		for i, m := range ms {
			if i > 0 {
				b.WriteByte(',')
			}
			m = strings.ReplaceAll(m, "'", "''")
			if backslash {
				m = strings.ReplaceAll(strings.ReplaceAll(m, `\`, `\\`), "''", "''")
			}
			b.WriteString("'" + m + "'")
		}
		b.WriteString(")")
		again, err := enumMembers(b.String(), backslash)
		if err != nil || !reflect.DeepEqual(again, ms) {
			t.Fatalf("%q → %q → %q → %q, %v", in, ms, b.String(), again, err)
		}
	})
}

func TestMemberText(t *testing.T) {
	ms := []string{"x", "y", "z"}
	for _, c := range []struct {
		set  bool
		v    uint64
		want string
		ok   bool
	}{
		{false, 0, "", true}, {false, 1, "x", true}, {false, 3, "z", true}, {false, 4, "", false},
		{true, 0, "", true}, {true, 5, "x,z", true}, {true, 7, "x,y,z", true}, {true, 8, "", false},
	} {
		got, ok := memberText(ms, c.set, c.v)
		if got != c.want || ok != c.ok {
			t.Errorf("memberText(set %v, %d) = %q, %v; want %q, %v", c.set, c.v, got, ok, c.want, c.ok)
		}
	}
}

func key(t testing.TB, vals ...any) rowkey.Key {
	t.Helper()
	k, err := rowkey.Encode(vals...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestHandleKey: the ledger's keys, typed and ordered as the applier writes them, become
// the checker's keys (keyValue's types, p.Key's order): the primary key columns in table
// or name order, ENUM indexes and SET bits as their text, unsigned integers; a table whose
// compared key is not the changefeed's handle, or whose candidate orders both fit, is
// compared whole.
func TestHandleKey(t *testing.T) {
	cols := []schemaColumn{
		{Name: "z_enum", DataType: "enum", ColumnType: "enum('a','it''s','b\\\\c')", Kind: kindString, Collation: "utf8mb4_bin"},
		{Name: "a_dec", DataType: "decimal", ColumnType: "decimal(10,2)", Kind: kindDecimal},
		{Name: "m_id", DataType: "bigint", ColumnType: "bigint unsigned", Kind: kindInt},
		{Name: "s", DataType: "set", ColumnType: "set('p','q')", Kind: kindString, Collation: "utf8mb4_bin"},
		{Name: "v", DataType: "int", ColumnType: "int", Kind: kindInt},
	}
	up := &tableSchema{Schema: "s", Name: "t", Columns: cols, PrimaryKey: []string{"a_dec", "z_enum", "m_id"}}
	down := &tableSchema{Schema: "s", Name: "t", Columns: cols, PrimaryKey: []string{"a_dec", "z_enum", "m_id"}}
	p, err := newPlan(up, down, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := newHandleKey(up, p, flavorMariaDB)
	if !h.ok || len(h.orders) != 2 {
		t.Fatalf("handle %+v", h)
	}
	// Table order (z_enum, a_dec, m_id), as the new architecture lists columns.
	entries := []ledger.Entry{
		{Key: key(t, uint64(2), "1.50", uint64(7)), CommitTs: 10},
		{Key: key(t, uint64(3), "-2.00", uint64(1<<63)), CommitTs: 11},
	}
	keys, note := h.translateAll(p, entries)
	want := []rowkey.Key{key(t, "-2.00", `b\c`, uint64(1<<63)), key(t, "1.50", "it's", uint64(7))}
	if note != "" || !reflect.DeepEqual(keys, want) {
		t.Fatalf("table order: %v %q, want %v", keys, note, want)
	}
	// Name order (a_dec, m_id, z_enum), as tiflow lists them.
	entries = []ledger.Entry{{Key: key(t, "1.50", uint64(7), uint64(2)), CommitTs: 10}}
	if keys, note := h.translateAll(p, entries); note != "" || !reflect.DeepEqual(keys, want[1:]) {
		t.Fatalf("name order: %v %q", keys, note)
	}
	// An ENUM index beyond the members, or a key of other types: compared whole.
	for _, bad := range []rowkey.Key{key(t, uint64(4), "1.50", uint64(7)), key(t, int64(1)), key(t, "x", "y", "z")} {
		if _, note := h.translateAll(p, []ledger.Entry{{Key: bad, CommitTs: 1}}); !strings.Contains(note, "do not fit") {
			t.Errorf("%v: note %q", bad, note)
		}
	}
	// Two integer key columns whose table and name orders differ: ambiguous.
	cols2 := []schemaColumn{{Name: "b", DataType: "int", ColumnType: "int", Kind: kindInt}, {Name: "a", DataType: "int", ColumnType: "int", Kind: kindInt}}
	up2 := &tableSchema{Columns: cols2, PrimaryKey: []string{"a", "b"}}
	p2, _ := newPlan(up2, up2, nil)
	h2 := newHandleKey(up2, p2, FlavorTiDB)
	if _, note := h2.translateAll(p2, []ledger.Entry{{Key: key(t, int64(1), int64(2)), CommitTs: 1}}); !strings.Contains(note, "ambiguous") {
		t.Errorf("ambiguous order: note %q", note)
	}
	// Same orders: one candidate, signed integers.
	up3 := &tableSchema{Columns: cols2, PrimaryKey: []string{"b"}}
	p3, _ := newPlan(up3, up3, nil)
	h3 := newHandleKey(up3, p3, FlavorTiDB)
	if len(h3.orders) != 1 {
		t.Errorf("single key: %d orders", len(h3.orders))
	}
	if _, note := h3.translateAll(p3, []ledger.Entry{{Key: key(t, uint64(5), uint64(5)), CommitTs: 1}}); !strings.Contains(note, "do not fit") {
		t.Errorf("two values for one key column: note %q", note)
	}
	// Compacted by the checker's typing: uint64(5) and int64(5) of a signed column are
	// one key (an unsigned downstream's value below 2^63).
	if keys, note := h3.translateAll(p3, []ledger.Entry{{Key: key(t, int64(-1)), CommitTs: 1}, {Key: key(t, uint64(5)), CommitTs: 2}, {Key: key(t, int64(5)), CommitTs: 3}}); note != "" ||
		!reflect.DeepEqual(keys, []rowkey.Key{key(t, int64(-1)), key(t, int64(5))}) {
		t.Errorf("single key: %v %q", keys, note)
	}
	// Not the handle: a unique key compared while a primary key exists; keyless.
	up4 := &tableSchema{Columns: cols2, PrimaryKey: []string{"a"}, UniqueKeys: [][]string{{"b"}}}
	p4, _ := newPlan(up4, up4, func(c string) bool { return c == "a" }) // the primary key's column ignored
	if h := newHandleKey(up4, p4, FlavorTiDB); h.ok || !strings.Contains(h.why, "not the primary key") {
		t.Errorf("non-handle key: %+v", h)
	}
	up5 := &tableSchema{Columns: cols2}
	p5, _ := newPlan(up5, up5, nil)
	if h := newHandleKey(up5, p5, FlavorTiDB); h.ok || !strings.Contains(h.why, "keyless") {
		t.Errorf("keyless: %+v", h)
	}
	up6 := &tableSchema{Columns: cols2, UniqueKeys: [][]string{{"a"}, {"b"}}}
	p6, _ := newPlan(up6, up6, nil)
	if h := newHandleKey(up6, p6, FlavorTiDB); h.ok || !strings.Contains(h.why, "2 NOT NULL unique keys") {
		t.Errorf("two unique keys: %+v", h)
	}
}

func TestClassOf(t *testing.T) {
	up := ledger.CaughtUp{Ts: 100, Found: true, Rows: 5, First: 10}
	for _, c := range []struct {
		cts     uint64
		changed bool
		up      ledger.CaughtUp
		want    string
	}{
		{0, false, up, ClassImported},
		{50, false, up, ClassImported},
		{99, true, up, ClassPostImport},
		{100, true, up, ClassCDC},
		{150, true, up, ClassCDC},
		{150, true, ledger.CaughtUp{Rows: 3, First: 10}, ClassPostImport}, // never caught up
		{150, true, ledger.CaughtUp{}, ClassCDC},                          // ts-map empty: unknown
		{0, false, ledger.CaughtUp{}, ClassImported},
	} {
		if got := classOf(c.cts, c.changed, c.up); got != c.want {
			t.Errorf("classOf(%d, %v, %+v) = %s, want %s", c.cts, c.changed, c.up, got, c.want)
		}
	}
}

// TestMatchForm: a difference's key and a ledger key of the same row match: character
// keys under their collation, DECIMAL by value, temporal text without trailing
// fractional zeros; different rows do not.
func TestMatchForm(t *testing.T) {
	p := &tablePlan{Columns: []planColumn{
		{Name: "s", Kind: kindString, Collation: [2]string{"utf8mb4_general_ci", "utf8mb4_general_ci"}},
		{Name: "d", Kind: kindDecimal},
		{Name: "t", Kind: kindTemporal},
		{Name: "b", Kind: kindString, Collation: [2]string{"utf8mb4_bin", "utf8mb4_bin"}},
	}, Key: []int{0, 1, 2, 3}}
	same := [][2][]any{
		{{"Ase", "1.50", "2026-01-02 03:04:05.100", "x"}, {"ASE ", "1.5", "2026-01-02 03:04:05.1", "x "}},
		{{"abc", "-0.00", "10:00:00.000", "y"}, {"abc", "0", "10:00:00", "y"}},
	}
	for _, c := range same {
		if a, b := p.matchForm(c[0]), p.matchForm(c[1]); a != b {
			t.Errorf("%q and %q: forms differ", c[0], c[1])
		}
	}
	differ := [][2][]any{
		{{"Ase", "1.50", "2026-01-02 03:04:05", "x"}, {"Asf", "1.50", "2026-01-02 03:04:05", "x"}},
		{{"Ase", "1.50", "2026-01-02 03:04:05", "x"}, {"Ase", "1.51", "2026-01-02 03:04:05", "x"}},
		{{"Ase", "1.50", "2026-01-02 03:04:05", "x"}, {"Ase", "1.50", "2026-01-02 03:04:05", "X"}},
		{{"Ase", "1.50", "2026-01-02 03:04:05", "x"}, {"Ase", "1.50", "2026-01-02 03:04:50", "x"}},
	}
	for _, c := range differ {
		if a, b := p.matchForm(c[0]), p.matchForm(c[1]); a == b {
			t.Errorf("%q and %q: forms equal", c[0], c[1])
		}
	}
}

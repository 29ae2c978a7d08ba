package canal

import (
	"bytes"
	"strings"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
	"github.com/tidb-parity/parity/cdc/internal/rowbuf"
	"github.com/tidb-parity/parity/cdc/open"
)

// The fast path decodes the records TiCDC writes with a hand-written scanner
// (cdc/internal/jsonscan) in one pass over the message, and boxes the values of all its
// rows with a few allocations (cdc/internal/rowbuf). It decodes a record only when it is
// sure to give what decodeSlow gives: on any error, and on shapes TiCDC never writes
// (a member twice, a member name that matches only case-insensitively, null where a
// value is expected), it gives up and Decode calls decodeSlow, whose rules and errors
// therefore stay the decoder's. FuzzFastPath checks the two agree.

// state is the scratch of one Decode call, kept by the Decoder for the next ones.
type state struct {
	sc     jsonscan.Scanner
	b      rowbuf.Builder
	names  jsonscan.Names // interned schema, table and column names
	tables map[tableKey]*tableTypes

	// The message, as read.
	mt           []byte     // mysqlType members: names and type texts, one after another
	mtSpans      []mtMember // where they are in mt
	data, old    []span     // the elements of data and old: byte ranges of the value
	pk           []string
	rowSeen      []bool // per column of the table: in the row being read
	isPK         []bool // per column of the table: in pkNames
	pkCols       []int
	cols         []span // per event: its columns in b
	oldCols      []span // per event of an UPDATE: its old columns in b
	tt           *tableTypes
	query, claim string

	// The table's cached types, looked up once the message's database and table are
	// read (looked), and whether its mysqlType was found to be the same (then mt and
	// mtSpans are not filled); mtRaw is where the message's mysqlType object is.
	cand   *tableTypes
	looked bool
	same   bool
	mtRaw  span
}

type span struct{ start, end int }

type mtMember struct{ name, typ span }

type tableKey struct{ schema, table string }

// tableTypes is what the last mysqlType of a table said: the message's mysqlType is
// compared member by member with it (TiCDC writes the members in random order) and
// parsed again only when it differs.
type tableTypes struct {
	// The last mysqlType and sqlType objects of the table, as bytes: a message whose
	// object starts with the same bytes has the same object (a JSON object ends at its
	// closing brace), recognized without scanning it (fast_types.go).
	mysqlType, sqlType []byte

	names []string       // interned column names
	plain []bool         // per name: jsonscan.Plain (the row reader may compare its bytes)
	raw   []string       // the mysqlType texts
	types []colType      // as columnTypes parses them
	index map[string]int // name → position
	next  []int          // the column that followed each one in the last row, -1 if none
	first int            // the first column of the last row
}

// maxTables bounds the cached types of a state, keepBytes the scratch it keeps.
const (
	maxTables = 1024
	keepBytes = 1 << 20
)

func (d *Decoder) state() *state {
	if st := d.states.Get(); st != nil {
		return st
	}
	return &state{tables: map[tableKey]*tableTypes{}}
}

func (d *Decoder) release(st *state) {
	st.b.Reset()
	st.sc.Reset(nil, keepBytes)
	st.query, st.claim, st.tt = "", "", nil
	st.cand, st.looked, st.same = nil, false, false
	clear(st.pk)
	if cap(st.mt) > keepBytes {
		st.mt = nil
	}
	st.names.Trim()
	if len(st.tables) > maxTables {
		clear(st.tables)
	}
	d.states.Put(st)
}

// Message types the fast path tells apart.
const (
	typeOther = iota
	typeInsert
	typeUpdate
	typeDelete
	typeWatermark
)

// Top-level members, as bits of a set of the members seen.
const (
	mDatabase = 1 << iota
	mTable
	mPKNames
	mIsDDL
	mType
	mSQL
	mMySQLType
	mData
	mOld
	mTiDB
	mCommitTs
	mWatermarkTs
	mOnlyHandleKey
	mClaimCheck
)

var memberNames = []string{"database", "table", "pkNames", "isDdl", "type", "sql", "mysqlType", "data", "old", "_tidb",
	"commitTs", "watermarkTs", "onlyHandleKey", "claimCheckLocation"}

// foldsToMember reports whether name matches a member of the message struct only
// case-insensitively (encoding/json would take it; the fast path leaves it to decodeSlow).
func foldsToMember(name []byte) bool {
	for _, m := range memberNames {
		if len(name) >= len(m)-2 && len(name) <= 3*len(m) && bytes.EqualFold(name, []byte(m)) {
			return true
		}
	}
	return false
}

// message is what the fast path reads of a message before deciding what it is.
type fastMessage struct {
	seen               int
	schema, table      string
	isDDL              bool
	typ                int
	commitTs, wmTs     uint64
	onlyHandle         bool
	commitSet, wmTsSet bool
	// The rows of data and old were decoded as they were read (the members they need
	// came before them, as TiCDC writes them), not recorded for later.
	dataRead, oldRead bool
}

// decode is the fast path; ok is false when it leaves the record to decodeSlow.
func (st *state) decode(value []byte) (evs []open.Event, ok bool) {
	st.sc.Reset(value, keepBytes)
	st.mt, st.mtSpans, st.data, st.old, st.pk = st.mt[:0], st.mtSpans[:0], st.data[:0], st.old[:0], st.pk[:0]
	st.cols, st.oldCols = st.cols[:0], st.oldCols[:0]
	st.cand, st.looked, st.same, st.mtRaw = nil, false, false, span{}
	var m fastMessage
	if !st.message(&m) {
		return nil, false
	}
	if m.seen&mTiDB == 0 {
		return nil, false
	}
	if m.typ == typeWatermark {
		if !m.wmTsSet {
			return nil, false
		}
		return []open.Event{{Kind: open.KindResolved, CommitTs: m.wmTs}}, true
	}
	if !m.commitSet || m.commitTs == 0 {
		return nil, false
	}
	if m.isDDL {
		if strings.TrimSpace(st.query) == "" {
			return nil, false
		}
		return []open.Event{{Kind: open.KindDDL, CommitTs: m.commitTs, Schema: m.schema, Table: m.table, Query: st.query}}, true
	}
	var op open.Op
	switch m.typ {
	case typeInsert:
		op = open.OpInsert
	case typeUpdate:
		op = open.OpUpdate
	case typeDelete:
		op = open.OpDelete
	default:
		return nil, false
	}
	nData, nOld := len(st.data), len(st.old)
	if m.dataRead {
		nData = len(st.cols)
	}
	if m.oldRead {
		nOld = len(st.oldCols)
	}
	if m.table == "" || nData == 0 || (op == open.OpUpdate && nOld != nData) {
		return nil, false
	}
	if !m.dataRead || (op == open.OpUpdate && !m.oldRead) {
		if st.tt == nil && !st.prepare(m.schema, m.table) {
			return nil, false
		}
		if !m.dataRead {
			for _, sp := range st.data {
				st.sc.Pos = sp.start // the element was skipped once: an object ending at sp.end
				c, ok := st.row(st.tt)
				if !ok {
					return nil, false
				}
				st.cols = append(st.cols, c)
			}
		}
		if op == open.OpUpdate && !m.oldRead {
			for _, sp := range st.old {
				st.sc.Pos = sp.start
				c, ok := st.row(st.tt)
				if !ok {
					return nil, false
				}
				st.oldCols = append(st.oldCols, c)
			}
		}
	}
	evs, cols := st.b.FinishEvents(nData)
	for i := range evs {
		c := st.cols[i]
		evs[i] = open.Event{Kind: open.KindRow, CommitTs: m.commitTs, Schema: m.schema, Table: m.table, Op: op,
			OnlyHandleKey: m.onlyHandle || st.claim != "", ClaimCheckLocation: st.claim,
			Columns: cols[c.start:c.end:c.end]}
		if op == open.OpUpdate {
			c = st.oldCols[i]
			evs[i].OldColumns = cols[c.start:c.end:c.end]
		}
	}
	return evs, true
}

// prepare finds the table's column types and its primary-key columns.
func (st *state) prepare(schema, table string) bool {
	if !st.same && len(st.mtSpans) == 0 {
		return false
	}
	tt := st.types(schema, table)
	if tt == nil {
		return false
	}
	st.isPK = resize(st.isPK, len(tt.names))
	st.rowSeen = resize(st.rowSeen, len(tt.names))
	st.pkCols = st.pkCols[:0]
	for _, n := range st.pk {
		i, found := tt.index[n]
		if !found {
			return false
		}
		if !st.isPK[i] {
			st.isPK[i] = true
			st.pkCols = append(st.pkCols, i)
		}
	}
	st.tt = tt
	return true
}

func resize(b []bool, n int) []bool {
	if cap(b) < n {
		return make([]bool, n)
	}
	b = b[:n]
	clear(b)
	return b
}

// message reads the top-level object.
func (st *state) message(m *fastMessage) bool {
	sc := &st.sc
	if sc.Expect('{') != nil {
		return false
	}
	for first := true; ; first = false {
		name, more, err := sc.Member(first)
		if err != nil {
			return false
		}
		if !more {
			break
		}
		bit := 0
		var ok bool
		switch string(name) {
		case "database":
			bit = mDatabase
			m.schema, ok = st.optString()
		case "table":
			bit = mTable
			m.table, ok = st.optString()
		case "pkNames":
			bit = mPKNames
			ok = st.pkNames()
		case "isDdl":
			bit = mIsDDL
			m.isDDL, ok = optBool(sc)
		case "type":
			bit = mType
			var b []byte
			if b, ok = st.str(); ok {
				switch string(b) {
				case "INSERT":
					m.typ = typeInsert
				case "UPDATE":
					m.typ = typeUpdate
				case "DELETE":
					m.typ = typeDelete
				case "TIDB_WATERMARK":
					m.typ = typeWatermark
				}
			}
		case "sql":
			bit = mSQL
			var b []byte
			if b, ok = st.str(); ok && len(b) > 0 {
				st.query = string(b)
			}
		case "mysqlType":
			bit = mMySQLType
			ok = st.mysqlType(m)
		case "data":
			bit = mData
			if st.rowsNow(m, false) {
				st.cols, ok = st.rows(st.cols)
				m.dataRead = true
			} else {
				st.data, ok = st.elements(st.data)
			}
		case "old":
			bit = mOld
			if st.rowsNow(m, true) {
				st.oldCols, ok = st.rows(st.oldCols)
				m.oldRead = true
			} else {
				st.old, ok = st.elements(st.old)
			}
		case "_tidb":
			bit = mTiDB
			ok = st.tidb(m)
		case "sqlType":
			ok = st.sqlType(m)
		case "id", "es", "ts": // TiCDC's members the decoder does not read
			ok = sc.Skip() == nil
		default:
			ok = !foldsToMember(name) && sc.Skip() == nil
		}
		if !ok || m.seen&bit != 0 {
			return false
		}
		m.seen |= bit
	}
	return st.sc.End() == nil
}

// rowsNow reports whether the rows of data (old) can be decoded as they are read: the
// message is a row change (an UPDATE, for old) and every member the rows depend on came
// before.
func (st *state) rowsNow(m *fastMessage, old bool) bool {
	const need = mDatabase | mTable | mPKNames | mMySQLType | mType | mIsDDL
	if m.seen&need != need || m.isDDL || m.typ == typeOther || m.typ == typeWatermark || (old && m.typ != typeUpdate) {
		return false
	}
	return st.tt != nil || st.prepare(m.schema, m.table)
}

// array reads an array or null, calling elem at each element (which reads it).
func (st *state) array(elem func() bool) bool {
	sc := &st.sc
	if sc.Null() {
		return true
	}
	if sc.Expect('[') != nil {
		return false
	}
	for first := true; ; first = false {
		more, err := sc.Element(first)
		if err != nil {
			return false
		}
		if !more {
			return true
		}
		if !elem() {
			return false
		}
	}
}

// rows decodes an array of rows (or null) into the builder.
func (st *state) rows(out []span) ([]span, bool) {
	out = out[:0]
	ok := st.array(func() bool {
		c, ok := st.row(st.tt)
		out = append(out, c)
		return ok
	})
	return out, ok
}

// str reads a string; null and anything else give up.
func (st *state) str() ([]byte, bool) {
	b, err := st.sc.Str()
	return b, err == nil
}

// optString reads an interned string or null (which encoding/json leaves "").
func (st *state) optString() (string, bool) {
	if st.sc.Null() {
		return "", true
	}
	b, ok := st.str()
	if !ok {
		return "", false
	}
	return st.names.Intern(b), true
}

func optBool(sc *jsonscan.Scanner) (bool, bool) {
	if sc.Null() {
		return false, true
	}
	v, err := sc.Bool()
	return v, err == nil
}

func (st *state) pkNames() bool {
	return st.array(func() bool {
		b, ok := st.str()
		if ok {
			st.pk = append(st.pk, st.names.Intern(b))
		}
		return ok
	})
}

// elements records where the elements of an array (or null) are.
func (st *state) elements(out []span) ([]span, bool) {
	out = out[:0]
	ok := st.array(func() bool {
		start := st.sc.Pos
		if st.sc.Peek() != '{' || st.sc.Skip() != nil {
			return false
		}
		out = append(out, span{start, st.sc.Pos})
		return true
	})
	return out, ok
}

func (st *state) tidb(m *fastMessage) bool {
	sc := &st.sc
	if sc.Expect('{') != nil {
		return false
	}
	for first := true; ; first = false {
		name, more, err := sc.Member(first)
		if err != nil {
			return false
		}
		if !more {
			return true
		}
		bit := 0
		ok := false
		switch string(name) {
		case "commitTs":
			bit = mCommitTs
			m.commitTs, ok = sc.Uint64()
			m.commitSet = ok
		case "watermarkTs":
			bit = mWatermarkTs
			m.wmTs, ok = sc.Uint64()
			m.wmTsSet = ok
		case "onlyHandleKey":
			bit = mOnlyHandleKey
			m.onlyHandle, ok = optBool(sc)
		case "claimCheckLocation":
			bit = mClaimCheck
			var b []byte
			if b, ok = st.str(); ok && len(b) > 0 {
				st.claim = string(b)
			}
		default:
			ok = !foldsToMember(name) && sc.Skip() == nil
		}
		if !ok || m.seen&bit != 0 {
			return false
		}
		m.seen |= bit
	}
}

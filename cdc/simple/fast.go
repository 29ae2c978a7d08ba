package simple

import (
	"bytes"
	"time"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
	"github.com/tidb-parity/parity/cdc/internal/rowbuf"
	"github.com/tidb-parity/parity/cdc/open"
)

// The fast path decodes the row records TiCDC writes (INSERT, UPDATE, DELETE) and its
// WATERMARK records with a hand-written scanner (cdc/internal/jsonscan) in one pass,
// verifies the rows' checksums, and boxes the values with a few allocations
// (cdc/internal/rowbuf). It decodes a record only when it is sure to give what
// decodeSlow gives, and changes nothing (the counters, the cache) unless it does: every
// other record — DDL, BOOTSTRAP, any error or checksum mismatch, shapes TiCDC never
// writes (a member twice, a member name that matches only case-insensitively) — is left
// to decodeSlow, whose rules, errors and counting therefore stay the decoder's.
// FuzzFastPath checks the two agree.

// state is the scratch of one Decode call, kept by the Decoder for the next ones.
type state struct {
	sc    jsonscan.Scanner
	b     rowbuf.Builder
	names jsonscan.Names            // interned schema and table names
	locs  map[string]*time.Location // TIMESTAMP locations by name

	present []bool   // per column of the image being read: in the message
	hash    []byte   // the checksummed bytes of an image
	tsHash  []byte   // the UTC text of the image's TIMESTAMPs, as checksummed
	tsSpans []tsSpan // where each TIMESTAMP's is
}

// tsSpan is where the checksummed text of the TIMESTAMP in builder column col is.
type tsSpan struct{ col, off, end int }

const (
	maxLocs   = 16384 // the time zones a state keeps
	keepBytes = 1 << 20
)

func (d *Decoder) state() *state {
	if st := d.states.Get(); st != nil {
		return st
	}
	return &state{locs: map[string]*time.Location{}}
}

func (d *Decoder) release(st *state) {
	st.b.Reset()
	st.sc.Reset(nil, keepBytes)
	if cap(st.hash) > keepBytes {
		st.hash = nil
	}
	st.names.Trim()
	if len(st.locs) > maxLocs {
		clear(st.locs)
	}
	d.states.Put(st)
}

// Members of a message and of its checksum, as bits of the set seen.
const (
	mVersion = 1 << iota
	mDatabase
	mTable
	mTableID
	mType
	mCommitTs
	mBuildTs
	mSchemaVersion
	mClaimCheck
	mHandleKeyOnly
	mSQL
	mChecksum
	mData
	mOld
	mCsVersion
	mCsCorrupted
	mCsCurrent
	mCsPrevious
)

var memberNames = []string{"version", "database", "table", "tableID", "type", "commitTs", "buildTs", "schemaVersion",
	"claimCheckLocation", "handleKeyOnly", "sql", "tableSchema", "preTableSchema", "checksum", "data", "old",
	"corrupted", "current", "previous"}

// foldsToMember reports whether name matches a member only case-insensitively (which
// encoding/json would take; the fast path leaves it to decodeSlow).
func foldsToMember(name []byte) bool {
	for _, m := range memberNames {
		if len(name) >= len(m) && len(name) <= 3*len(m) && bytes.EqualFold(name, []byte(m)) {
			return true
		}
	}
	return false
}

// fastMessage is what the fast path reads of a row message.
type fastMessage struct {
	seen          int
	schema, table string
	op            open.Op
	commitTs      uint64
	schemaVersion uint64
	handleOnly    bool
	watermark     bool      // a WATERMARK: its commitTs is all it says
	data, old     byteRange // the data and old objects (start 0: absent or null)
	cs            wireChecksum
	t             *table
	// The images of data and old decoded as they were read (the members they need came
	// before them, as TiCDC writes them), not left for later.
	img [2]imageRead
}

type imageRead struct {
	read bool
	sum  uint32
	cols byteRange // in the builder
}

type byteRange struct{ start, end int }

// decode is the fast path; ok is false when it leaves the record to decodeSlow.
func (st *state) decode(d *Decoder, value []byte) (evs []open.Event, ok bool) {
	st.sc.Reset(value, keepBytes)
	var m fastMessage
	if !st.message(d, &m) {
		return nil, false
	}
	if m.watermark {
		// What decodeSlow makes of it; without a commitTs it is decodeSlow's error.
		if m.seen&(mVersion|mType|mCommitTs) != mVersion|mType|mCommitTs {
			return nil, false
		}
		return watermark(m.commitTs), true
	}
	const need = mVersion | mType | mDatabase | mTable | mCommitTs | mSchemaVersion
	if m.seen&need != need {
		return nil, false
	}
	t := st.rowTable(d, &m)
	if t == nil {
		return nil, false
	}
	// Which images the message must and must not have, as row() requires.
	var newImg, oldImg byteRange
	switch m.op {
	case open.OpInsert:
		if m.data.start == 0 || m.old.start != 0 {
			return nil, false
		}
		newImg = m.data
	case open.OpUpdate:
		if m.data.start == 0 || m.old.start == 0 {
			return nil, false
		}
		newImg, oldImg = m.data, m.old
	case open.OpDelete:
		if m.old.start == 0 || m.data.start != 0 {
			return nil, false
		}
		oldImg = m.old
	}
	cs := m.cs
	if cs.Corrupted || cs.Version < 0 || cs.Version > 2 ||
		(m.op == open.OpInsert && cs.Previous != 0) || (m.op == open.OpDelete && cs.Current != 0) {
		return nil, false
	}
	var cols, old byteRange
	verified, without := 0, 0
	for k, im := range []struct {
		sp   byteRange
		want uint32
		out  *byteRange
	}{{newImg, cs.Current, &cols}, {oldImg, cs.Previous, &old}} {
		if im.sp.start == 0 {
			continue
		}
		got := m.img[k].sum
		if m.img[k].read {
			*im.out = m.img[k].cols
		} else {
			st.sc.Pos = im.sp.start // skipped once: an object ending at im.sp.end
			var ok bool
			if got, ok = st.image(d, t, m.handleOnly, im.out); !ok {
				return nil, false
			}
		}
		switch {
		case im.want == 0 || m.handleOnly:
			without++
		case im.want == got:
			verified++
		default:
			return nil, false // a mismatch: decodeSlow counts and reports it
		}
	}
	evs, all := st.b.FinishEvents(1)
	ev := &evs[0]
	*ev = open.Event{Kind: open.KindRow, CommitTs: m.commitTs, Schema: m.schema, Table: m.table, Op: m.op, OnlyHandleKey: m.handleOnly}
	if m.op == open.OpDelete {
		ev.Columns = all[old.start:old.end:old.end]
	} else {
		ev.Columns = all[cols.start:cols.end:cols.end]
		if m.op == open.OpUpdate {
			ev.OldColumns = all[old.start:old.end:old.end]
		}
	}
	d.verified.Add(uint64(verified))
	d.without.Add(uint64(without))
	return evs, true
}

// rowTable returns the cached table of a row message whose database, table, type and
// schemaVersion have been read, or nil.
func (st *state) rowTable(d *Decoder, m *fastMessage) *table {
	const need = mDatabase | mTable | mType | mSchemaVersion
	if m.t == nil && m.seen&need == need && m.op != 0 && m.schema != "" && m.table != "" {
		m.t, _ = d.lookup(m.schema, m.table, m.schemaVersion)
	}
	return m.t
}

// message reads the top-level object; it leaves every message but a row's.
func (st *state) message(d *Decoder, m *fastMessage) bool {
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
		bit, ok := 0, false
		switch string(name) {
		case "version":
			bit = mVersion
			raw, err := sc.Number()
			ok = err == nil && string(raw) == "1"
		case "database":
			bit = mDatabase
			m.schema, ok = st.optString()
		case "table":
			bit = mTable
			m.table, ok = st.optString()
		case "tableID":
			bit = mTableID
			ok = optInt(sc)
		case "buildTs":
			bit = mBuildTs
			ok = optInt(sc)
		case "type":
			bit = mType
			var b []byte
			if b, err = sc.Str(); err == nil {
				switch string(b) {
				case "INSERT":
					m.op, ok = open.OpInsert, true
				case "UPDATE":
					m.op, ok = open.OpUpdate, true
				case "DELETE":
					m.op, ok = open.OpDelete, true
				case "WATERMARK":
					m.watermark, ok = true, true
				}
			}
		case "commitTs":
			bit = mCommitTs
			m.commitTs, ok = sc.Uint64()
		case "schemaVersion":
			bit = mSchemaVersion
			m.schemaVersion, ok = sc.Uint64()
		case "claimCheckLocation":
			bit = mClaimCheck
			var b []byte
			if !sc.Null() {
				b, err = sc.Str()
				ok = err == nil && len(b) == 0
			} else {
				ok = true
			}
		case "handleKeyOnly":
			bit = mHandleKeyOnly
			m.handleOnly, ok = optBool(sc)
			ok = ok && !m.img[0].read && !m.img[1].read // the images were read without it
		case "sql":
			bit = mSQL
			_, ok = st.optString()
		case "checksum":
			bit = mChecksum
			ok = st.checksum(m)
		case "data":
			bit = mData
			m.data, ok = st.imageNow(d, m, 0)
		case "old":
			bit = mOld
			m.old, ok = st.imageNow(d, m, 1)
		default:
			ok = !foldsToMember(name) && sc.Skip() == nil
		}
		if !ok || m.seen&bit != 0 {
			return false
		}
		m.seen |= bit
	}
	return sc.End() == nil
}

// imageNow reads image k (0 data, 1 old) where it is when its table is known, else
// records where it is for later.
func (st *state) imageNow(d *Decoder, m *fastMessage, k int) (byteRange, bool) {
	sc := &st.sc
	if sc.Peek() != '{' || st.rowTable(d, m) == nil {
		return st.object()
	}
	start := sc.Pos
	r := &m.img[k]
	var ok bool
	r.sum, ok = st.image(d, m.t, m.handleOnly, &r.cols)
	r.read = ok
	return byteRange{start, sc.Pos}, ok
}

// object records where an object value is (start 0 for null).
func (st *state) object() (byteRange, bool) {
	sc := &st.sc
	if sc.Null() {
		return byteRange{}, true
	}
	start := sc.Pos
	if sc.Peek() != '{' || sc.Skip() != nil {
		return byteRange{}, false
	}
	return byteRange{start, sc.Pos}, true
}

func (st *state) checksum(m *fastMessage) bool {
	sc := &st.sc
	if sc.Null() {
		return true
	}
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
		bit, ok := 0, false
		switch string(name) {
		case "version":
			bit = mCsVersion
			var v int64
			if sc.Null() {
				ok = true
			} else if v, ok = sc.Int64(); ok {
				m.cs.Version = int(v)
				ok = int64(m.cs.Version) == v
			}
		case "corrupted":
			bit = mCsCorrupted
			m.cs.Corrupted, ok = optBool(sc)
		case "current":
			bit = mCsCurrent
			m.cs.Current, ok = optUint32(sc)
		case "previous":
			bit = mCsPrevious
			m.cs.Previous, ok = optUint32(sc)
		default:
			ok = !foldsToMember(name) && sc.Skip() == nil
		}
		if !ok || m.seen&bit != 0 {
			return false
		}
		m.seen |= bit
	}
}

// optString reads an interned string or null (which encoding/json leaves "").
func (st *state) optString() (string, bool) {
	if st.sc.Null() {
		return "", true
	}
	b, err := st.sc.Str()
	if err != nil {
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

// optInt checks an int64 or null.
func optInt(sc *jsonscan.Scanner) bool {
	if sc.Null() {
		return true
	}
	_, ok := sc.Int64()
	return ok
}

func optUint32(sc *jsonscan.Scanner) (uint32, bool) {
	if sc.Null() {
		return 0, true
	}
	v, ok := sc.Uint64()
	return uint32(v), ok && v <= 1<<32-1
}

package canal

import (
	"bytes"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
)

// Every row message repeats its table's mysqlType and sqlType. The fast path keeps the
// table's last of each (tableTypes) and recognizes an unchanged object by comparing
// bytes: a message whose object starts with the cached bytes has exactly that object,
// because the cached bytes are a complete JSON object (validated when first read) and a
// JSON object ends at its closing brace. sqlType is then passed over without scanning
// it; mysqlType too, and when TiCDC wrote its members in another order (they come from
// a Go map), they are compared with the cached types by name as they are read. Only a
// mysqlType that differs is copied and parsed (types).

// maxCachedObject bounds the bytes of a cached mysqlType or sqlType object.
const maxCachedObject = 64 << 10

// candidate returns the table's cached types once the message's database and table
// have been read, or nil.
func (st *state) candidate(m *fastMessage) *tableTypes {
	if !st.looked && m.seen&(mDatabase|mTable) == mDatabase|mTable {
		st.looked = true
		st.cand = st.tables[tableKey{m.schema, m.table}]
	}
	return st.cand
}

// cached reports whether the input at the scanner's position starts with obj, and if so
// moves past it.
func (st *state) cached(obj []byte) bool {
	sc := &st.sc
	if len(obj) > 0 && bytes.HasPrefix(sc.Data[sc.Pos:], obj) {
		sc.Pos += len(obj)
		return true
	}
	return false
}

// sqlType validates the sqlType member (which the decoder does not use).
func (st *state) sqlType(m *fastMessage) bool {
	sc := &st.sc
	if sc.Peek() != '{' {
		return sc.Skip() == nil
	}
	tt := st.candidate(m)
	if tt != nil && st.cached(tt.sqlType) {
		return true
	}
	start := sc.Pos
	if sc.Skip() != nil {
		return false
	}
	if tt != nil && sc.Pos-start <= maxCachedObject {
		tt.sqlType = append(tt.sqlType[:0], sc.Data[start:sc.Pos]...)
	}
	return true
}

// mysqlType reads the mysqlType member: st.same when it has the cached types of the
// table, else its members (name, type text) copied into st.mt.
func (st *state) mysqlType(m *fastMessage) bool {
	sc := &st.sc
	if sc.Null() {
		return true
	}
	if sc.Peek() != '{' {
		return false
	}
	start := sc.Pos
	if tt := st.candidate(m); tt != nil {
		if st.cached(tt.mysqlType) {
			st.same = true
			return true
		}
		if st.sameMySQLType(tt) {
			if sc.Pos-start <= maxCachedObject {
				tt.mysqlType = append(tt.mysqlType[:0], sc.Data[start:sc.Pos]...)
			}
			st.same = true
			return true
		}
		sc.Pos = start
	}
	sc.Pos++ // '{'
	for first := true; ; first = false {
		name, more, err := sc.Member(first)
		if err != nil {
			return false
		}
		if !more {
			st.mtRaw = span{start, sc.Pos}
			return true
		}
		var mm mtMember
		mm.name.start = len(st.mt)
		st.mt = append(st.mt, name...)
		mm.name.end = len(st.mt)
		mm.typ.start = len(st.mt)
		if st.mt, err = sc.AppendStr(st.mt); err != nil {
			return false
		}
		mm.typ.end = len(st.mt)
		st.mtSpans = append(st.mtSpans, mm)
	}
}

// sameMySQLType reads the mysqlType object at the scanner's position and reports
// whether it has exactly tt's members (in any order); on false the position is
// unspecified.
func (st *state) sameMySQLType(tt *tableTypes) bool {
	sc := &st.sc
	sc.Pos++ // '{'
	seen := resize(st.rowSeen, len(tt.names))
	st.rowSeen = seen
	n := 0
	for first := true; ; first = false {
		name, more, err := sc.Member(first)
		if err != nil {
			return false
		}
		if !more {
			return n == len(tt.names)
		}
		i, found := tt.index[string(name)]
		if !found || seen[i] {
			return false
		}
		seen[i] = true
		typ, err := sc.Str()
		if err != nil || tt.raw[i] != string(typ) {
			return false
		}
		n++
	}
}

// types returns the table's column types as this message's mysqlType gives them.
func (st *state) types(schema, table string) *tableTypes {
	if st.same {
		return st.cand // the message's table's, with the same mysqlType
	}
	key := tableKey{schema, table}
	old := st.tables[key]
	if old != nil && st.sameTypes(old) {
		return old
	}
	tt := &tableTypes{index: make(map[string]int, len(st.mtSpans)), first: -1}
	if old != nil {
		tt.sqlType, old.sqlType = old.sqlType, nil // the table's, whatever its types
	}
	for _, mm := range st.mtSpans {
		name := st.mt[mm.name.start:mm.name.end]
		if _, dup := tt.index[string(name)]; dup {
			return nil
		}
		raw := string(st.mt[mm.typ.start:mm.typ.end])
		t, ok := parseType(raw)
		if !ok {
			return nil
		}
		n := st.names.Intern(name)
		tt.index[n] = len(tt.names)
		tt.names = append(tt.names, n)
		tt.plain = append(tt.plain, jsonscan.Plain(n))
		tt.raw = append(tt.raw, raw)
		tt.types = append(tt.types, t)
		tt.next = append(tt.next, -1)
	}
	if r := st.mtRaw; r.end > r.start && r.end-r.start <= maxCachedObject {
		tt.mysqlType = bytes.Clone(st.sc.Data[r.start:r.end])
	}
	st.tables[key] = tt
	return tt
}

// sameTypes reports whether the message's mysqlType has exactly tt's members.
func (st *state) sameTypes(tt *tableTypes) bool {
	if len(st.mtSpans) != len(tt.names) {
		return false
	}
	seen := resize(st.rowSeen, len(tt.names))
	st.rowSeen = seen
	for _, mm := range st.mtSpans {
		i, ok := tt.index[string(st.mt[mm.name.start:mm.name.end])]
		if !ok || seen[i] || tt.raw[i] != string(st.mt[mm.typ.start:mm.typ.end]) {
			return false
		}
		seen[i] = true
	}
	return true
}

// parseType is columnTypes for one mysqlType text.
func parseType(s string) (colType, bool) {
	t, err := columnType("", s)
	return t, err == nil
}

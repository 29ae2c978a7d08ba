package open

// key.go reads a record's key JSON ({"ts":…,"scm":…,"tbl":…,"rid":…,"t":1}), resuming
// after the members a key shares with the key before it.

import (
	"bytes"
	"fmt"
)

// keyOf sets ev's key fields from the key JSON data. TiCDC writes the keys of a
// transaction's rows of one table in a record alike up to the row id:
// {"ts":…,"scm":…,"tbl":…,"rid":…,"t":1} (the new architecture writes no "rid", so its
// keys are equal). When data begins with the bytes of the last key's leading "ts", "scm"
// and "tbl" members, their values are taken from that key and the parse resumes after
// them: the parse reads left to right, so the same bytes leave it in the same state, and
// the result is the one a full parse gives.
func (st *decodeState) keyOf(data []byte, ev *Event) error {
	if n := st.keyPrefix; n > 0 && len(data) > n && bytes.Equal(data[:n], st.lastKey[:n]) {
		ev.CommitTs, ev.Schema, ev.Table = st.keyTs, st.keySchema, st.keyTable
		return st.key(data, ev, n)
	}
	st.lastKey, st.keyPrefix = nil, 0
	if err := st.key(data, ev, 0); err != nil {
		st.keyPrefix = 0
		return err
	}
	if st.keyPrefix > 0 {
		st.lastKey = data
	}
	return nil
}

// key parses a key JSON object into ev; from byte resume, when it is not 0, with ev's
// "ts", "scm" and "tbl" set by the members before it (see keyOf). A parse from the start
// records in st.keyPrefix where those three members end when the key begins with them,
// and their values in st.keyTs, keySchema and keyTable.
func (st *decodeState) key(data []byte, ev *Event, resume int) error {
	s := &st.sc
	s.Data, s.Pos = data, 0
	first, haveTs := true, false
	if resume > 0 {
		s.Pos, first, haveTs = resume, false, true
	} else if err := s.Expect('{'); err != nil {
		return err
	}
	var haveT bool
	var t int64
	member := 0 // how many of "ts", "scm", "tbl" the key began with; -1 once it did not
	if resume > 0 {
		member = -1
	}
	for ; ; first = false {
		name, ok, err := s.Member(first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		m := member
		member = -1 // unless the member below is the next of "ts", "scm", "tbl"
		switch string(name) {
		case "ts":
			raw, err := st.number()
			if err != nil {
				return inField("ts", err)
			}
			if ev.CommitTs, err = atou64(raw); err != nil || !isInteger(raw) {
				return inField("ts", &syntaxError{pos: s.Pos - len(raw), msg: fmt.Sprintf("ts %s is not a uint64", raw), err: ErrRange})
			}
			haveTs = true
			if m == 0 {
				member = 1
			}
		case "scm":
			v, err := st.name()
			if err != nil {
				return inField("scm", err)
			}
			ev.Schema = v
			if m == 1 {
				member = 2
			}
		case "tbl":
			v, err := st.name()
			if err != nil {
				return inField("tbl", err)
			}
			ev.Table = v
			if m == 2 { // the prefix ends here (a later member may repeat one of its values)
				st.keyPrefix = s.Pos
				st.keyTs, st.keySchema, st.keyTable = ev.CommitTs, ev.Schema, ev.Table
			}
		case "rid":
			if ev.RowID, err = st.int64(); err != nil {
				return inField("rid", err)
			}
		case "ptn":
			if ev.Partition, err = st.int64(); err != nil {
				return inField("ptn", err)
			}
		case "t":
			if t, err = st.int64(); err != nil {
				return inField("t", err)
			}
			haveT = true
		case "ohk":
			if ev.OnlyHandleKey, err = boolean(s); err != nil {
				return inField("ohk", err)
			}
		case "ccl":
			v, err := st.string()
			if err != nil {
				return inField("ccl", err)
			}
			ev.ClaimCheckLocation = v
		default:
			if err := s.Skip(); err != nil {
				return inField(string(name), err)
			}
		}
	}
	if err := s.End(); err != nil {
		return err
	}
	if !haveTs {
		return inField("ts", ErrMissingField)
	}
	if !haveT {
		return inField("t", ErrMissingField)
	}
	switch t {
	case int64(KindRow), int64(KindDDL), int64(KindResolved):
		ev.Kind = Kind(t)
	default:
		return inField("t", fmt.Errorf("%w %d", ErrKind, t))
	}
	return nil
}

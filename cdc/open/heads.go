package open

// heads.go keeps what the columns of the last section said up to their values, so that
// a column beginning with the same bytes resumes its parse at its value (column).

// colHead is what a column's members before its value say.
type colHead struct {
	haveT, haveF, handle bool
	t                    int64
	f                    uint64
}

// colHeads keeps, per column position of a section, the bytes of the last column there
// from its '{' to where its value starts ({"t":8,"h":true,"f":11,"v":) and what they
// said. The bytes end inside the "v" member, so they cannot be the beginning of other
// members: a column beginning with them is, up to its value, the same column, and its
// parse resumes at the value in the state they left. The bytes are copies (a
// decompressed payload's buffer is reused), kept across records.
type colHeads struct {
	heads []colHeadAt
	buf   []byte
}

type colHeadAt struct {
	off, end int
	c        colHead
}

// maxHeadBytes bounds colHeads.buf: past it, every head is dropped.
const maxHeadBytes = 16 << 10

func (h *colHeads) at(j int) *colHeadAt {
	if j < len(h.heads) && h.heads[j].end > 0 {
		return &h.heads[j]
	}
	return nil
}

func (h *colHeads) set(j int, b []byte, c colHead) {
	if j >= 256 {
		return
	}
	if len(h.buf)+len(b) > maxHeadBytes {
		h.buf, h.heads = h.buf[:0], h.heads[:0]
	}
	for len(h.heads) <= j {
		h.heads = append(h.heads, colHeadAt{})
	}
	off := len(h.buf)
	h.buf = append(h.buf, b...)
	h.heads[j] = colHeadAt{off: off, end: len(h.buf), c: c}
}

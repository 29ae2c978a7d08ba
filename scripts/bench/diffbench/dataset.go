package main

import (
	"fmt"
	"hash/crc32"
	"sort"
	"strconv"

	"github.com/tidb-parity/parity/internal/ident"
)

// Dataset describes the deterministic content of one sysbench-style sbtest table:
//
//	id INT PRIMARY KEY, k INT, c CHAR(120), pad CHAR(60), KEY k_1(k)
//
// Rows holds exactly Rows rows whose ids lie in 1..Rows+Holes; the Holes ids that are left
// out are scattered over the key range, so "extra" rows can be injected into a copy at
// scattered keys (sysbench's own ids are contiguous, which would force every extra row to
// the end of the key range). Every column is a pure function of (Seed, id), so any row can
// be regenerated — to load in parallel, to revert an injected difference, or to compute
// the expected checksum in Go.
type Dataset struct {
	Seed  uint64
	Rows  int64
	Holes int
}

// Row is one sbtest row.
type Row struct {
	ID  int64
	K   int64
	C   string
	Pad string
}

// MaxID is the largest id the dataset may hold.
func (d Dataset) MaxID() int64 { return d.Rows + int64(d.Holes) }

// HoleIDs returns the ids in 1..MaxID that the dataset leaves out, sorted: one per equal
// slice of the key range, at a seed-dependent offset inside its slice.
func (d Dataset) HoleIDs() []int64 {
	holes := make([]int64, 0, d.Holes)
	if d.Holes == 0 {
		return holes
	}
	span := d.MaxID() / int64(d.Holes)
	for j := 0; j < d.Holes; j++ {
		lo := int64(j)*span + 1
		off := int64(splitmix64(d.Seed^0x686f6c65^uint64(j)) % uint64(span))
		holes = append(holes, lo+off)
	}
	return holes
}

// ForEachID calls f for every id of the dataset in [from, to], ascending.
func (d Dataset) ForEachID(from, to int64, f func(id int64)) {
	holes := d.HoleIDs()
	h := sort.Search(len(holes), func(i int) bool { return holes[i] >= from })
	for id := from; id <= to; id++ {
		if h < len(holes) && holes[h] == id {
			h++
			continue
		}
		f(id)
	}
}

// Row generates the row with the given id (also for hole ids: that is the content of an
// injected extra row). Content follows sysbench's oltp_common.lua: k uniform in
// 1..Rows, c ten and pad five groups of 11 random digits joined by '-'.
func (d Dataset) Row(id int64) Row {
	return d.row(id, 0)
}

// row generates the row for id under a variant; variant 0 is the dataset's content, other
// variants give different random content for the same id (used for changed rows).
func (d Dataset) row(id int64, variant uint64) Row {
	s := splitmix64(d.Seed ^ uint64(id)*0x9e3779b97f4a7c15 ^ variant<<56)
	r := rng{s: s | 1}
	k := int64(r.next()%uint64(d.Rows)) + 1
	return Row{ID: id, K: k, C: r.digitGroups(10), Pad: r.digitGroups(5)}
}

// Expected is a checksum of a table's content that is computed both in SQL (verifySQL)
// and in Go from the generator, to prove a loaded table holds exactly the dataset without
// trusting the code under test.
type Expected struct {
	Count int64
	Xor   uint64
	Sum   uint64
}

// verifySQL returns the query that computes Expected on a server.
func verifySQL(db, table string) string {
	return fmt.Sprintf("SELECT COUNT(*), COALESCE(BIT_XOR(CRC32(CONCAT_WS('#',id,k,c,pad))),0), "+
		"COALESCE(SUM(CRC32(CONCAT_WS('#',id,k,c,pad))),0) FROM %s.%s", ident.Quote(db), ident.Quote(table))
}

// rowCRC matches CRC32(CONCAT_WS('#',id,k,c,pad)) in SQL.
func rowCRC(r Row) uint32 {
	b := make([]byte, 0, 200)
	b = strconv.AppendInt(b, r.ID, 10)
	b = append(b, '#')
	b = strconv.AppendInt(b, r.K, 10)
	b = append(b, '#')
	b = append(b, r.C...)
	b = append(b, '#')
	b = append(b, r.Pad...)
	return crc32.ChecksumIEEE(b)
}

// Expected computes the checksum of the whole dataset in Go.
func (d Dataset) Expected() Expected {
	var e Expected
	d.ForEachID(1, d.MaxID(), func(id int64) {
		c := rowCRC(d.Row(id))
		e.Count++
		e.Xor ^= uint64(c)
		e.Sum += uint64(c)
	})
	return e
}

// DiffKind is the kind of an injected difference, seen from the downstream copy.
type DiffKind string

const (
	Changed DiffKind = "differing" // the downstream row has a different value in Column
	Missing DiffKind = "missing"   // the downstream lacks the row
	Extra   DiffKind = "extra"     // the downstream has a row the upstream lacks
)

// Difference is one injected difference.
type Difference struct {
	Kind   DiffKind
	ID     int64
	Column string // for Changed: k, c or pad
}

// Differences plans changed+missing+extra scattered differences: changed and missing rows
// at distinct existing ids spread evenly over the key range (with a seed-dependent jitter),
// extra rows at the dataset's hole ids. The plan is deterministic, so a run that was killed
// half-way can still revert it.
func (d Dataset) Differences(changed, missing, extra int) ([]Difference, error) {
	if extra > d.Holes {
		return nil, fmt.Errorf("plan differences: %d extra rows need at least %d holes, dataset has %d", extra, extra, d.Holes)
	}
	n := changed + missing
	if int64(n) > d.Rows/4 {
		return nil, fmt.Errorf("plan differences: %d changed+missing rows in a %d-row table", n, d.Rows)
	}
	isHole := map[int64]bool{}
	for _, h := range d.HoleIDs() {
		isHole[h] = true
	}
	var out []Difference
	span := d.MaxID() / int64(max(n, 1))
	cols := []string{"k", "c", "pad"}
	for i := 0; i < n; i++ {
		id := int64(i)*span + 1 + int64(splitmix64(d.Seed^0x64696666^uint64(i))%uint64(span))
		for isHole[id] {
			id++
		}
		// Interleave kinds so both are spread over the whole key range.
		if (i%3 != 2 && changed > 0) || missing == 0 {
			out = append(out, Difference{Kind: Changed, ID: id, Column: cols[changed%3]})
			changed--
		} else {
			out = append(out, Difference{Kind: Missing, ID: id})
			missing--
		}
	}
	for _, h := range d.HoleIDs()[:extra] {
		out = append(out, Difference{Kind: Extra, ID: h})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// changedRow returns the downstream content of a changed row: the original row with one
// column replaced by a different value.
func (d Dataset) changedRow(diff Difference) Row {
	orig := d.Row(diff.ID)
	alt := d.row(diff.ID, 1)
	switch diff.Column {
	case "k":
		orig.K = orig.K%d.Rows + 1 // always different
	case "c":
		if alt.C == orig.C {
			alt = d.row(diff.ID, 2)
		}
		orig.C = alt.C
	case "pad":
		if alt.Pad == orig.Pad {
			alt = d.row(diff.ID, 2)
		}
		orig.Pad = alt.Pad
	}
	return orig
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// rng is xorshift64*: fast, deterministic, good enough for test content.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s ^= r.s >> 12
	r.s ^= r.s << 25
	r.s ^= r.s >> 27
	return r.s * 0x2545f4914f6cdd1d
}

// digitGroups returns n groups of 11 random decimal digits joined by '-'.
func (r *rng) digitGroups(n int) string {
	b := make([]byte, 0, n*12)
	for g := 0; g < n; g++ {
		if g > 0 {
			b = append(b, '-')
		}
		v := r.next()
		w := r.next()
		for i := 0; i < 11; i++ {
			if i < 10 {
				b = append(b, byte('0'+v%10))
				v /= 10
			} else {
				b = append(b, byte('0'+w%10))
			}
		}
	}
	return string(b)
}

package rowbuf

import "github.com/tidb-parity/parity/cdc/open"

// maxBlockCols is the most columns block puts beside an event.
const maxBlockCols = 64

// block returns one event and n columns (n <= maxBlockCols, else nil) allocated
// together: a struct of an event and an array of the next size class of columns
// (at most a quarter more than n beyond 8). The slices are capacity-limited, so an
// append copies rather than write into the other's memory.
func block(n int) ([]open.Event, []open.Column) {
	switch {
	case n <= 1:
		b := new(struct {
			e [1]open.Event
			c [1]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 2:
		b := new(struct {
			e [1]open.Event
			c [2]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 3:
		b := new(struct {
			e [1]open.Event
			c [3]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 4:
		b := new(struct {
			e [1]open.Event
			c [4]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 5:
		b := new(struct {
			e [1]open.Event
			c [5]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 6:
		b := new(struct {
			e [1]open.Event
			c [6]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 8:
		b := new(struct {
			e [1]open.Event
			c [8]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 10:
		b := new(struct {
			e [1]open.Event
			c [10]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 12:
		b := new(struct {
			e [1]open.Event
			c [12]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 14:
		b := new(struct {
			e [1]open.Event
			c [14]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 16:
		b := new(struct {
			e [1]open.Event
			c [16]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 20:
		b := new(struct {
			e [1]open.Event
			c [20]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 24:
		b := new(struct {
			e [1]open.Event
			c [24]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 28:
		b := new(struct {
			e [1]open.Event
			c [28]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 32:
		b := new(struct {
			e [1]open.Event
			c [32]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 40:
		b := new(struct {
			e [1]open.Event
			c [40]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 48:
		b := new(struct {
			e [1]open.Event
			c [48]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 56:
		b := new(struct {
			e [1]open.Event
			c [56]open.Column
		})
		return b.e[:], b.c[:n:n]
	case n <= 64:
		b := new(struct {
			e [1]open.Event
			c [64]open.Column
		})
		return b.e[:], b.c[:n:n]
	}
	return nil, nil
}

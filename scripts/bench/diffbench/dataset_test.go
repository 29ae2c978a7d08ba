package main

import (
	"regexp"
	"testing"
)

func TestDatasetIDsAndRows(t *testing.T) {
	d := Dataset{Seed: 7, Rows: 10_000, Holes: 20}
	holes := d.HoleIDs()
	if len(holes) != 20 {
		t.Fatalf("HoleIDs: %d holes, want 20", len(holes))
	}
	isHole := map[int64]bool{}
	for i, h := range holes {
		if h < 1 || h > d.MaxID() || (i > 0 && h <= holes[i-1]) {
			t.Fatalf("HoleIDs not sorted distinct ids in 1..%d: %v", d.MaxID(), holes)
		}
		isHole[h] = true
	}
	var n int64
	d.ForEachID(1, d.MaxID(), func(id int64) {
		if isHole[id] {
			t.Fatalf("ForEachID yielded hole id %d", id)
		}
		n++
	})
	if n != d.Rows {
		t.Fatalf("ForEachID yielded %d ids, want %d", n, d.Rows)
	}
	c := regexp.MustCompile(`^[0-9]{11}(-[0-9]{11}){9}$`)
	pad := regexp.MustCompile(`^[0-9]{11}(-[0-9]{11}){4}$`)
	for _, id := range []int64{1, 2, 5000, d.MaxID()} {
		r := d.Row(id)
		if r != d.Row(id) {
			t.Fatalf("Row(%d) is not deterministic", id)
		}
		if !c.MatchString(r.C) || !pad.MatchString(r.Pad) || r.K < 1 || r.K > d.Rows {
			t.Fatalf("Row(%d) = %+v: not sysbench-shaped", id, r)
		}
	}
	if d.Row(1) == (Dataset{Seed: 8, Rows: 10_000, Holes: 20}).Row(1) {
		t.Fatal("the seed does not change the content")
	}
}

func TestDifferencesPlan(t *testing.T) {
	d := Dataset{Seed: 20261121, Rows: 1_000_000, Holes: 50}
	plan, err := d.Differences(50, 25, 25)
	if err != nil {
		t.Fatal(err)
	}
	isHole := map[int64]bool{}
	for _, h := range d.HoleIDs() {
		isHole[h] = true
	}
	kinds := map[DiffKind]int{}
	cols := map[string]int{}
	seen := map[int64]bool{}
	for i, x := range plan {
		kinds[x.Kind]++
		if seen[x.ID] {
			t.Fatalf("id %d planned twice", x.ID)
		}
		seen[x.ID] = true
		if (x.Kind == Extra) != isHole[x.ID] {
			t.Fatalf("%s row at id %d: extra rows must be exactly at hole ids", x.Kind, x.ID)
		}
		if i > 0 && plan[i-1].ID >= x.ID {
			t.Fatal("plan not sorted by id")
		}
		if x.Kind == Changed {
			cols[x.Column]++
			orig, changed := d.Row(x.ID), d.changedRow(x)
			diff := map[string]bool{"k": orig.K != changed.K, "c": orig.C != changed.C, "pad": orig.Pad != changed.Pad}
			for col, differs := range diff {
				if differs != (col == x.Column) {
					t.Fatalf("changed row %d: column %s differs=%v, planned column %s", x.ID, col, differs, x.Column)
				}
			}
		}
	}
	if kinds[Changed] != 50 || kinds[Missing] != 25 || kinds[Extra] != 25 {
		t.Fatalf("kinds = %v, want 50 changed, 25 missing, 25 extra", kinds)
	}
	if cols["k"] == 0 || cols["c"] == 0 || cols["pad"] == 0 {
		t.Fatalf("changed columns %v: want all of k, c, pad", cols)
	}
	// Scattered: no gap between consecutive differences exceeds a few slices of the range.
	for i := 1; i < len(plan); i++ {
		if gap := plan[i].ID - plan[i-1].ID; gap > 3*d.MaxID()/50 {
			t.Fatalf("gap of %d ids between differences %d and %d: not scattered", gap, plan[i-1].ID, plan[i].ID)
		}
	}
	again, _ := d.Differences(50, 25, 25)
	for i := range plan {
		if plan[i] != again[i] {
			t.Fatal("plan is not deterministic")
		}
	}
	if _, err := d.Differences(1, 1, 51); err == nil {
		t.Fatal("51 extra rows with 50 holes: want an error")
	}
}

func TestRowCRCMatchesSQLFormat(t *testing.T) {
	// CRC32('1#2#a#b') computed by MariaDB and TiDB.
	if got := rowCRC(Row{ID: 1, K: 2, C: "a", Pad: "b"}); got != 0x2f263b34 {
		t.Fatalf("rowCRC = %#x, want 0x2f263b34", got)
	}
}

func TestCompareFound(t *testing.T) {
	want := []Difference{{Kind: Changed, ID: 1, Column: "c"}, {Kind: Missing, ID: 2}, {Kind: Extra, ID: 3}}
	for _, tc := range []struct {
		name  string
		found []Difference
		ok    bool
	}{
		{"exact", []Difference{{Kind: Extra, ID: 3}, {Kind: Changed, ID: 1, Column: "c"}, {Kind: Missing, ID: 2}}, true},
		{"column unknown", []Difference{{Kind: Changed, ID: 1}, {Kind: Missing, ID: 2}, {Kind: Extra, ID: 3}}, true},
		{"missed one", []Difference{{Kind: Changed, ID: 1, Column: "c"}, {Kind: Missing, ID: 2}}, false},
		{"bogus one", append([]Difference{{Kind: Extra, ID: 9}}, want...), false},
		{"wrong kind", []Difference{{Kind: Changed, ID: 1, Column: "c"}, {Kind: Extra, ID: 2}, {Kind: Extra, ID: 3}}, false},
		{"wrong column", []Difference{{Kind: Changed, ID: 1, Column: "k"}, {Kind: Missing, ID: 2}, {Kind: Extra, ID: 3}}, false},
		{"twice", append([]Difference{{Kind: Missing, ID: 2}}, want...), false},
	} {
		if ok, detail := compareFound(want, tc.found); ok != tc.ok {
			t.Errorf("%s: compareFound = %v (%s), want %v", tc.name, ok, detail, tc.ok)
		}
	}
}

func TestParityConcurrency(t *testing.T) {
	for args, want := range map[string]int{"": 0, "--concurrency 8": 8, "--hash md5 --concurrency=2": 2, "--concurrency": 0} {
		if n, _ := parityConcurrency(args); n != want {
			t.Errorf("parityConcurrency(%q) = %d, want %d", args, n, want)
		}
	}
}

package cdc

import (
	"fmt"
	"slices"
	"testing"
)

func TestAssignLanes(t *testing.T) {
	mk := func(counts ...int) []*tableBuf {
		var out []*tableBuf
		for i, n := range counts {
			tb := &tableBuf{key: tableKey{"s", fmt.Sprint("t", i)}, sorted: true}
			for j := 0; j < n; j++ {
				tb.mem = append(tb.mem, bufEvent{ts: uint64(10 + j%5), seq: uint64(j)})
			}
			// rows above the target are not counted
			tb.mem = append(tb.mem, bufEvent{ts: 100, seq: uint64(n)}, bufEvent{ts: 100, seq: uint64(n + 1)})
			out = append(out, tb)
		}
		return out
	}
	tests := []struct {
		name    string
		counts  []int
		workers int
		want    [][]int
	}{
		{"one table takes every worker", []int{1000}, 8, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}},
		{"equal tables get one worker each", []int{100, 100, 100, 100}, 4, [][]int{{0}, {1}, {2}, {3}}},
		{"two tables split the workers", []int{500, 500}, 8, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}},
		{"skewed: the big table gets every worker", []int{10, 700, 10, 10}, 4, [][]int{{0}, {0, 1, 2, 3}, {1}, {2}}},
		{"skewed: two thirds get two thirds", []int{300, 600}, 3, [][]int{{2}, {0, 1}}},
		{"more tables than workers", []int{5, 5, 5, 5, 5}, 2, [][]int{{0}, {1}, {0}, {1}, {0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := assignLanes(roundCounts(mk(tc.counts...), 50), tc.workers)
			if !slices.EqualFunc(got, tc.want, slices.Equal[[]int]) {
				t.Fatalf("lanes %v, want %v", got, tc.want)
			}
			for i, lane := range got {
				for _, w := range lane {
					if w < 0 || w >= tc.workers {
						t.Fatalf("table %d: worker %d out of range", i, w)
					}
				}
			}
		})
	}
}

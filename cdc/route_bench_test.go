package cdc

import (
	"fmt"
	"testing"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/rowkey"
)

// BenchmarkRouteKey measures what routing a row costs per key shape: the collation-aware
// key (tableInfo.routeKey) and its hash. "bytes" hashes a string key's bytes as they are
// (rowkey.Exact: what routing cost before keys were folded, and what a _bin key costs);
// the ratio lines compare each folded shape with it.
func BenchmarkRouteKey(b *testing.B) {
	a := newApplier(nil, nil, DefaultConfig(), nil, nil, nil, nil)
	rows := func(mk func(i int) open.Column) [][]open.Column {
		out := make([][]open.Column, 1024)
		for i := range out {
			out[i] = []open.Column{mk(i), {Name: "v", Type: open.TypeLonglong, Value: int64(i)}}
		}
		return out
	}
	str := func(f string) func(i int) open.Column {
		return func(i int) open.Column {
			return open.Column{Name: "k", Type: open.TypeVarchar, Flags: hk, Value: fmt.Sprintf(f, i)}
		}
	}
	cases := []struct {
		name  string
		class rowkey.Class
		rows  [][]open.Column
	}{
		{"int", rowkey.Exact, rows(func(i int) open.Column {
			return open.Column{Name: "k", Type: open.TypeLonglong, Flags: hk | open.FlagBinary, Value: int64(i) * 7919}
		})},
		{"bytes", rowkey.Exact, rows(str("customer-%08d@example.com"))},
		{"bin", rowkey.PadSpace, rows(str("customer-%08d@example.com"))},
		{"ci-ascii", rowkey.Folded, rows(str("Customer-%08d@Example.com"))},
		{"ci-latin", rowkey.Folded, rows(str("Cliënt-Müller-%08d"))},
		{"ci-cjk", rowkey.Folded, rows(str("客户-%08d-北京"))},
	}
	ns := map[string]float64{}
	for _, tc := range cases {
		info := &tableInfo{exists: true, classes: map[string]rowkey.Class{"k": tc.class}}
		b.Run(tc.name, func(b *testing.B) {
			var key []byte
			var sum uint64
			for i := 0; b.Loop(); i++ {
				var ok bool
				key, ok = info.routeKey(key[:0], tc.rows[i%len(tc.rows)])
				if !ok {
					b.Fatal("unfoldable")
				}
				sum += a.hashKey(key)
			}
			_ = sum
			ns[tc.name] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		})
	}
	if base := ns["bytes"]; base > 0 {
		for _, tc := range cases {
			fmt.Printf("route key %-8s %7.1f ns/row  %.2fx the bytes baseline\n", tc.name, ns[tc.name], ns[tc.name]/base)
		}
	}
}

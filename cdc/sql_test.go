package cdc

import (
	"bytes"
	"context"
	"math"
	"testing"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
)

// TestStatementValuesRoundTrip writes awkward values through buildUpsert (literal
// statements, and placeholder statements for strings with a backslash or NUL) on apply
// sessions with and without NO_BACKSLASH_ESCAPES, and reads back exactly what was written.
func TestStatementValuesRoundTrip(t *testing.T) {
	down := testenv.Downstream(t)
	strs := []string{"", "plain", "it's", `"dq"`, "''", "a\nb\r\n", "ctrl-z \x1a", "tëxt 漢字 🙂", "--", "/*c*/", "?",
		`back\slash`, `\'`, `trailing\`, "nul\x00byte", `\\0\n`}
	bins := [][]byte{{}, {0}, {'\\'}, {'\''}, {0xff, 0xfe, 0}, []byte("text")}
	for _, mode := range []string{"STRICT_TRANS_TABLES", "STRICT_TRANS_TABLES,NO_BACKSLASH_ESCAPES"} {
		t.Run(mode, func(t *testing.T) {
			table := testenv.UniqueName("rt")
			exec(t, down.DB, "CREATE TABLE "+ident.Table(down.Name, table)+
				" (id BIGINT PRIMARY KEY, s VARCHAR(64) CHARACTER SET utf8mb4, b VARBINARY(16), u BIGINT UNSIGNED, d DOUBLE, f FLOAT)")
			db, err := openDB("downstream", down.DSN, map[string]string{"sql_mode": "'" + mode + "'"}, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			row := func(id int64, s any, b any) []open.Column {
				return []open.Column{
					{Name: "id", Flags: open.FlagHandleKey, Value: id},
					{Name: "s", Value: s},
					{Name: "b", Flags: open.FlagBinary, Value: b},
					{Name: "u", Flags: open.FlagUnsigned, Value: uint64(math.MaxUint64 - uint64(id))},
					{Name: "d", Value: -2.2250738585072014e-308 * float64(id)},
					{Name: "f", Value: float64(float32(1.1))},
				}
			}
			var rows [][]open.Column
			for i, s := range strs {
				// One statement per value: a backslash or NUL makes only its own
				// statement fall back to placeholders.
				r := row(int64(i), s, bins[i%len(bins)])
				rows = append(rows, r)
				q, args := buildUpsert(down.Name, table, [][]open.Column{r}, modeUpsert)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := db.ExecContext(ctx, q, args...)
				cancel()
				if err != nil {
					t.Fatalf("value %q: %s: %v", s, q, err)
				}
			}
			rows = append(rows, row(100, nil, nil))
			q, args := buildUpsert(down.Name, table, rows[len(rows)-1:], modeUpsert)
			if _, err := db.Exec(q, args...); err != nil {
				t.Fatal(err)
			}
			for _, r := range rows {
				var s, b []byte
				var sNull, bNull bool
				var u uint64
				var d float64
				var f float32
				err := db.QueryRow("SELECT s, s IS NULL, b, b IS NULL, u, d, f FROM "+ident.Table(down.Name, table)+" WHERE id = ?", r[0].Value).
					Scan(&s, &sNull, &b, &bNull, &u, &d, &f)
				if err != nil {
					t.Fatal(err)
				}
				if sNull != (r[1].Value == nil) || (!sNull && string(s) != r[1].Value.(string)) {
					t.Errorf("id %v: string %q (null %t), want %#v", r[0].Value, s, sNull, r[1].Value)
				}
				if bNull != (r[2].Value == nil) || (!bNull && !bytes.Equal(b, r[2].Value.([]byte))) {
					t.Errorf("id %v: binary %x (null %t), want %#v", r[0].Value, b, bNull, r[2].Value)
				}
				if u != r[3].Value.(uint64) || d != r[4].Value.(float64) || f != float32(r[5].Value.(float64)) {
					t.Errorf("id %v: numbers %d %v %v, want %v %v %v", r[0].Value, u, d, f, r[3].Value, r[4].Value, r[5].Value)
				}
			}
		})
	}
}

package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tidb-parity/parity/checker"
)

// hashAlternative is one way to checksum a whole table in one pushed-down query.
type hashAlternative struct {
	name string
	sql  func(cols, table string) string // cols: the column list, table: `db`.`t`
}

// hashAlternatives are the per-row hashes issue 5 asks to compare; parity's own checksum
// SQL is added by the caller (see engineChecksumSQL).
var hashAlternatives = []hashAlternative{
	{"CRC32 (32-bit, BIT_XOR)", func(cols, t string) string {
		return fmt.Sprintf("SELECT COUNT(*), BIT_XOR(CRC32(CONCAT_WS('#',%s))) FROM %s", cols, t)
	}},
	{"SHA1 folded to 64 bits", func(cols, t string) string {
		return fmt.Sprintf("SELECT COUNT(*), BIT_XOR(CAST(CONV(LEFT(SHA1(CONCAT_WS('#',%s)),16),16,10) AS UNSIGNED)) FROM %s", cols, t)
	}},
	{"MD5 folded to 64 bits", func(cols, t string) string {
		return fmt.Sprintf("SELECT COUNT(*), BIT_XOR(CAST(CONV(LEFT(MD5(CONCAT_WS('#',%s)),16),16,10) AS UNSIGNED)) FROM %s", cols, t)
	}},
	{"reladiff (MD5, SUM)", func(cols, t string) string {
		return fmt.Sprintf("SELECT COUNT(*), SUM(CAST(CONV(SUBSTRING(MD5(CONCAT(%s)),18),16,10) AS UNSIGNED)) FROM %s", cols, t)
	}},
	{"sync-diff-inspector (double MD5)", func(cols, t string) string {
		isnull := make([]string, 0, 4)
		for _, c := range strings.Split(cols, ",") {
			isnull = append(isnull, "ISNULL("+c+")")
		}
		row := fmt.Sprintf("CONCAT_WS(',',%s,CONCAT(%s))", cols, strings.Join(isnull, ","))
		return fmt.Sprintf("SELECT COUNT(*), BIT_XOR(CAST(CONV(SUBSTRING(MD5(%s),1,16),16,10) AS UNSIGNED) ^ CAST(CONV(SUBSTRING(MD5(%s),17,16),16,10) AS UNSIGNED)) FROM %s", row, row, t)
	}},
}

// benchHashes times each checksum alternative over the whole table on each server, one
// query at a time, and prints the table.
func benchHashes(ctx context.Context, w io.Writer, tables []*Table) error {
	type row struct {
		name  string
		times []time.Duration
	}
	alts := append([]hashAlternative(nil), hashAlternatives...)
	var rows []row
	cols := "`id`,`k`,`c`,`pad`"
	for _, a := range alts {
		r := row{name: a.name}
		for _, t := range tables {
			d, err := timeQuery(ctx, t, a.sql(cols, t.qname()))
			if err != nil {
				return fmt.Errorf("hash %s on %s: %w", a.name, t.S.Name, err)
			}
			r.times = append(r.times, d)
		}
		rows = append(rows, r)
	}
	// parity's own checksum SQL (checker.ChunkSQL.Checksum) with each of its hashes.
	engine := make([]map[checker.Hash]string, len(tables))
	for i, t := range tables {
		m, err := engineHashSQL(ctx, t)
		if err != nil {
			return fmt.Errorf("parity checksum SQL for %s: %w", t.S.Name, err)
		}
		engine[i] = m
	}
	for _, h := range []checker.Hash{checker.HashSHA1, checker.HashMD5, checker.HashCRC32Pair} {
		r := row{name: "parity ChecksumSQL, hash " + string(h)}
		if h == checker.DefaultConfig().Hash {
			r.name += " (default)"
		}
		for i, t := range tables {
			d, err := timeQuery(ctx, t, engine[i][h])
			if err != nil {
				return fmt.Errorf("parity checksum SQL (%s) on %s: %w", h, t.S.Name, err)
			}
			r.times = append(r.times, d)
		}
		rows = append(rows, r)
	}
	r := row{name: "parity ChecksumSQL, sha1, TiDB pushdown form"}
	for i, t := range tables {
		q, ok := engine[i][pushdownSHA1]
		if !ok {
			r.times = append(r.times, -1) // not TiDB: no such form
			continue
		}
		d, err := timeQuery(ctx, t, q)
		if err != nil {
			return fmt.Errorf("parity checksum SQL (pushdown) on %s: %w", t.S.Name, err)
		}
		r.times = append(r.times, d)
	}
	rows = append(rows, r)
	fmt.Fprintf(w, "\n== per-row hash alternatives: one whole-table COUNT+aggregate query over %d rows ==\n", tables[0].Data.Rows)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	hdr := "hash"
	for _, t := range tables {
		hdr += "\t" + t.S.Name
	}
	fmt.Fprintln(tw, hdr)
	for _, r := range rows {
		line := r.name
		for _, d := range r.times {
			if d < 0 {
				line += "\t-"
				continue
			}
			line += "\t" + secs(d)
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

func timeQuery(ctx context.Context, t *Table, q string) (time.Duration, error) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	start := time.Now()
	rows, err := t.S.DB.QueryContext(qctx, q)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	for rows.Next() {
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

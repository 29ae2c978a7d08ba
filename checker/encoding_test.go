package checker

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestRowEncodingInjective hashes every combination of values chosen to collide under a
// careless encoding (NULL, ”, 'N', 'NULL', separators, digits, values that could move
// between columns), including the last NOT NULL string column that is encoded without a
// length prefix, and checks that all rows hash differently and that TiDB and MariaDB
// compute the same hashes.
func TestRowEncodingInjective(t *testing.T) {
	p := tidbPair(t)
	vals := encodingRows(t, p, "enc",
		[]string{"NULL", "", "=NULL", "N", ",", "a", "a,", ",a", "1", "1,", "0:"},
		[]string{"", ",", "N", "1", "a,1", "1:,"},
		[]string{"NULL", "1", "11"},
		[]string{"", ",", "N", "1,", ",1", "0:"},
		[]string{"NULL", "", "N"})
	plan := p.plan(t, "enc", FlavorTiDB)
	if raw := plan.rawLast(); raw < 0 || plan.Columns[raw].Name != "b" {
		t.Fatalf("rawLast = %d, want the column b", raw)
	}
	hashes := func(s pairSide) []string {
		db := p.up.DB
		if s == downSide {
			db = p.down.DB
		}
		out := firstColumn(t, db, "SELECT "+plan.rowHash(s)+" FROM "+plan.table(s))
		slices.Sort(out)
		return out
	}
	check := func() {
		t.Helper()
		uh, dh := hashes(upSide), hashes(downSide)
		if len(uh) != len(vals) {
			t.Fatalf("%d hashes for %d rows", len(uh), len(vals))
		}
		if n := len(slices.Compact(slices.Clone(uh))); n != len(vals) {
			t.Errorf("%d distinct hashes for %d distinct rows: the encoding is not injective\n%s", n, len(vals), plan.rowEncoding(upSide))
		}
		if !slices.Equal(uh, dh) {
			t.Errorf("TiDB and MariaDB hash equal rows differently\n%s\n%s", plan.rowEncoding(upSide), plan.rowEncoding(downSide))
		}
	}
	check()
	// Every string column digested (as fitEncoding digests wide ones; these are short):
	// still injective, with the digested raw-last column too.
	for i, c := range plan.Columns {
		plan.Columns[i].Digest = c.Kind == kindString || c.Kind == kindBinary
	}
	if !strings.Contains(plan.rowEncoding(upSide), "SHA1(`b`)") {
		t.Fatalf("the raw-last column b is not digested: %s", plan.rowEncoding(upSide))
	}
	check()
}

// TestRowEncodingDecodes proves the row encoding injective on real servers the direct way:
// it reads each row together with the encoding the server computes for it (TiDB and
// MariaDB) and decodes the encoding back into the row's values with decodeRow, which knows
// only the plan. A decoder that recovers every row means no two rows can encode alike.
// The rows combine NULL, ”, 'N', 'NULL', separators, digits and length-like prefixes
// ("0,", "1,N", "4,NULL") in every column, so values that shift a column boundary, a
// separator inside a value and NULL against its look-alikes are all covered; every
// encoding must also be distinct.
func TestRowEncodingDecodes(t *testing.T) {
	p := tidbPair(t)
	vals := encodingRows(t, p, "encdec",
		[]string{"NULL", "", "=NULL", "N", ",", "a,", "1", "0,", "1,N", "4,NULL"},
		[]string{"", ",", "N", "=NULL", "1,", "0,"},
		[]string{"NULL", "1", "11"},
		[]string{"", ",", "N", "1,", ",1", "0:"},
		[]string{"NULL", "", "N", "1,N"})
	plan := p.plan(t, "encdec", FlavorTiDB)
	for _, s := range []pairSide{upSide, downSide} {
		db := p.up.DB
		if s == downSide {
			db = p.down.DB
		}
		rows, err := db.QueryContext(context.Background(), "SELECT n, a, i, b, z, "+plan.rowEncoding(s)+" FROM "+plan.table(s))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for rows.Next() {
			var cols [5]sql.NullString
			var enc []byte
			if err := rows.Scan(&cols[0], &cols[1], &cols[2], &cols[3], &cols[4], &enc); err != nil {
				t.Fatal(err)
			}
			got, err := decodeRow(plan, enc)
			if err != nil {
				t.Fatalf("%s: decode %q: %v", s, enc, err)
			}
			for c := range cols {
				if want := cols[c]; want.Valid != (got[c] != nil) || (want.Valid && want.String != *got[c]) {
					t.Errorf("%s: %q decodes column %s to %v, the row holds %v", s, enc, plan.Columns[c].Name, show(got[c]), want)
				}
			}
			if seen[string(enc)] {
				t.Errorf("%s: two rows encode as %q", s, enc)
			}
			seen[string(enc)] = true
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
		if len(seen) != len(vals) {
			t.Errorf("%s: %d distinct encodings for %d rows", s, len(seen), len(vals))
		}
	}
}

// encodingRows creates table on both sides with the columns of the row-encoding tests (n
// nullable, a NOT NULL, i a nullable INT, b the NOT NULL binary encoded last without a
// length, z nullable) and inserts every combination of the given values: "NULL" is NULL
// and any other value the string after an optional leading "=" ("=NULL" is 'NULL'). It
// returns the rows' literals.
func encodingRows(t *testing.T, p pair, table string, ns, as, is, bs, zs []string) []string {
	t.Helper()
	p.both(t, "CREATE TABLE "+table+" (n VARCHAR(10) NULL, a VARCHAR(10) NOT NULL, i INT NULL, b VARBINARY(10) NOT NULL, z VARCHAR(10) NULL) CHARSET utf8mb4 COLLATE utf8mb4_bin")
	lit := func(v string) string {
		if v == "NULL" {
			return v
		}
		return "'" + strings.TrimPrefix(v, "=") + "'"
	}
	var vals []string
	for _, n := range ns {
		for _, a := range as {
			for _, i := range is {
				for _, b := range bs {
					for _, z := range zs {
						vals = append(vals, fmt.Sprintf("(%s,%s,%s,%s,%s)", lit(n), lit(a), i, lit(b), lit(z)))
					}
				}
			}
		}
	}
	for start := 0; start < len(vals); start += 500 {
		p.both(t, "INSERT INTO "+table+" VALUES "+strings.Join(vals[start:min(start+500, len(vals))], ","))
	}
	return vals
}

func show(v *string) string {
	if v == nil {
		return "NULL"
	}
	return fmt.Sprintf("%q", *v)
}

// decodeRow inverts rowEncoding: it returns the value of every plan column (nil for NULL)
// read from an encoding, using only the plan, or an error when the encoding is not one
// rowEncoding can produce.
func decodeRow(p *tablePlan, enc []byte) ([]*string, error) {
	out := make([]*string, len(p.Columns))
	pos, ended := 0, false
	// field reads up to the next ',' (or the end of the encoding, after which nothing
	// may follow).
	field := func() (string, error) {
		if ended {
			return "", errors.New("encoding ends too early")
		}
		i := bytes.IndexByte(enc[pos:], ',')
		if i < 0 {
			f := string(enc[pos:])
			pos, ended = len(enc), true
			return f, nil
		}
		f := string(enc[pos : pos+i])
		pos += i + 1
		return f, nil
	}
	raw := p.rawLast()
	for i, c := range p.Columns {
		if i == raw {
			continue
		}
		f, err := field()
		if err != nil {
			return nil, fmt.Errorf("column %s: %w", c.Name, err)
		}
		if !c.NotNull && f == "N" {
			continue // NULL (a variable-bytes column's value field was skipped)
		}
		switch c.Kind {
		case kindString, kindBinary, kindJSON:
			n, err := strconv.Atoi(f)
			if err != nil || n < 0 || pos+n > len(enc) || ended {
				return nil, fmt.Errorf("column %s: bad length field %q", c.Name, f)
			}
			v := string(enc[pos : pos+n])
			out[i] = &v
			pos += n
			switch {
			case pos == len(enc):
				ended = true
			case enc[pos] == ',':
				pos++
			default:
				return nil, fmt.Errorf("column %s: no separator after %d bytes", c.Name, n)
			}
		default:
			out[i] = &f
		}
	}
	if raw >= 0 {
		if ended && len(p.Columns) > 1 {
			return nil, errors.New("no field left for the last string column")
		}
		v := string(enc[pos:])
		out[raw] = &v
	} else if !ended {
		return nil, fmt.Errorf("%d bytes left over", len(enc)-pos)
	}
	return out, nil
}

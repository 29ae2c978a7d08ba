package loadgen

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/tidb-parity/parity/internal/ident"
)

// Names of the tables the generator creates besides sbtest1..N.
const (
	AllTypesTable = "alltypes" // one column of every type TiCDC's open protocol carries
	KeylessTable  = "keyless"  // no primary or unique key: rows are matched on all columns
)

// kind is the shape of a generated table.
type kind int

const (
	kindSysbench kind = iota
	kindAllTypes
	kindKeyless
)

// tableSpec is a table the generator owns: its DDL (valid on TiDB and on MySQL/MariaDB, in
// the form TiCDC re-renders DDL: back-quoted names, upper-case keywords, TiDB features in
// /*T! */ comments) and how to fill it.
type tableSpec struct {
	name string
	kind kind
	ddl  string
}

func sysbenchDDL(name, idType string) string {
	return fmt.Sprintf("CREATE TABLE %s (\n"+
		"  `id` %s NOT NULL AUTO_INCREMENT,\n"+
		"  `k` INT NOT NULL DEFAULT '0',\n"+
		"  `c` CHAR(120) NOT NULL DEFAULT '',\n"+
		"  `pad` CHAR(60) NOT NULL DEFAULT '',\n"+
		"  PRIMARY KEY (`id`) /*T![clustered_index] CLUSTERED */,\n"+
		"  KEY `k_1` (`k`)\n"+
		") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin", ident.Quote(name), idType)
}

const allTypesDDL = "CREATE TABLE `alltypes` (\n" +
	"  `id` BIGINT NOT NULL,\n" +
	"  `c_tinyint` TINYINT NULL, `c_tinyint_u` TINYINT UNSIGNED NULL,\n" +
	"  `c_smallint` SMALLINT NULL, `c_mediumint` MEDIUMINT NULL,\n" +
	"  `c_int` INT NULL, `c_int_u` INT UNSIGNED NULL,\n" +
	"  `c_bigint` BIGINT NULL, `c_bigint_u` BIGINT UNSIGNED NULL,\n" +
	"  `c_float` FLOAT NULL, `c_double` DOUBLE NULL, `c_decimal` DECIMAL(20,6) NULL,\n" +
	"  `c_char` CHAR(48) NULL, `c_varchar` VARCHAR(64) NULL,\n" +
	"  `c_binary` BINARY(8) NULL, `c_varbinary` VARBINARY(32) NULL,\n" +
	"  `c_tinytext` TINYTEXT NULL, `c_text` TEXT NULL, `c_mediumtext` MEDIUMTEXT NULL, `c_longtext` LONGTEXT NULL,\n" +
	"  `c_tinyblob` TINYBLOB NULL, `c_blob` BLOB NULL, `c_mediumblob` MEDIUMBLOB NULL, `c_longblob` LONGBLOB NULL,\n" +
	"  `c_date` DATE NULL, `c_datetime` DATETIME NULL, `c_datetime6` DATETIME(6) NULL,\n" +
	"  `c_timestamp` TIMESTAMP NULL, `c_timestamp3` TIMESTAMP(3) NULL,\n" +
	"  `c_time` TIME NULL, `c_time3` TIME(3) NULL, `c_year` YEAR NULL,\n" +
	"  `c_enum` ENUM('a','b','c') NULL, `c_set` SET('x','y','z') NULL, `c_bit` BIT(10) NULL,\n" +
	"  `c_json` JSON NULL,\n" +
	"  PRIMARY KEY (`id`) /*T![clustered_index] CLUSTERED */\n" +
	") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"

const keylessDDL = "CREATE TABLE `keyless` (\n" +
	"  `a` INT NULL,\n" +
	"  `b` VARCHAR(32) NULL\n" +
	") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"

// ddlIn is the spec's DDL creating the table in schema (the DDL event carries ddl, with
// the event's schema, as TiCDC sends it).
func (s tableSpec) ddlIn(schema string) string {
	return strings.Replace(s.ddl, "CREATE TABLE "+ident.Quote(s.name),
		"CREATE TABLE "+ident.Quote(schema)+"."+ident.Quote(s.name), 1)
}

// specs returns the tables a configuration asks for (the same in every schema).
func specs(cfg *Config) []tableSpec {
	idType := "INT"
	if strings.EqualFold(cfg.IDType, "bigint") {
		idType = "BIGINT"
	}
	var out []tableSpec
	for i := 1; i <= cfg.Tables; i++ {
		name := fmt.Sprintf("sbtest%d", i)
		out = append(out, tableSpec{name: name, kind: kindSysbench, ddl: sysbenchDDL(name, idType)})
	}
	if cfg.AllTypes {
		out = append(out, tableSpec{name: AllTypesTable, kind: kindAllTypes, ddl: allTypesDDL})
	}
	if cfg.Keyless {
		out = append(out, tableSpec{name: KeylessTable, kind: kindKeyless, ddl: keylessDDL})
	}
	return out
}

// sysbench-style value generators: c and pad are groups of 11 digits joined by '-'.
func sbString(r *rand.Rand, groups int) string {
	var b strings.Builder
	for i := 0; i < groups; i++ {
		if i > 0 {
			b.WriteByte('-')
		}
		fmt.Fprintf(&b, "%011d", r.Int64N(100_000_000_000))
	}
	return b.String()
}

// SysbenchC and SysbenchPad return values for sysbench's c (119 characters) and pad
// (59 characters) columns; exported for the benchmarks that write sysbench rows
// without the generator.
func SysbenchC(r *rand.Rand) string   { return sbString(r, 10) }
func SysbenchPad(r *rand.Rand) string { return sbString(r, 5) }

// sbK returns a k value; a narrow range so the secondary index has duplicates.
func sbK(r *rand.Rand, rows int64) int64 {
	if rows < 10 {
		rows = 10
	}
	return r.Int64N(rows) + 1
}

var textSamples = []string{
	"", "plain ascii", "测试中文字符", "quote ' and \" and \\ backslash", "<html>&amp;</html>",
	"tab\tnew\nline", "emoji 😀", "trailing dot.",
}

// allTypesValues returns the values of every non-id column of an alltypes row, in table
// order; each is NULL with a small probability.
func allTypesValues(r *rand.Rand) []any {
	null := func(v any) any {
		if r.IntN(12) == 0 {
			return nil
		}
		return v
	}
	bin := func(n int) []byte {
		b := make([]byte, r.IntN(n+1))
		for i := range b {
			b[i] = byte(r.IntN(256))
		}
		return b
	}
	text := func() string { return textSamples[r.IntN(len(textSamples))] + fmt.Sprint(r.IntN(1000)) }
	dt := func() string {
		return fmt.Sprintf("%04d-%02d-%02d %02d:%02d:%02d", 1980+r.IntN(50), 1+r.IntN(12), 1+r.IntN(28),
			r.IntN(24), r.IntN(60), r.IntN(60))
	}
	return []any{
		null(int64(r.IntN(256) - 128)), null(uint64(r.IntN(256))),
		null(int64(r.IntN(65536) - 32768)), null(int64(r.IntN(1<<24) - 1<<23)),
		null(int64(r.Int32()) - int64(r.Int32())), null(uint64(r.Uint32())),
		null(r.Int64() - r.Int64()/2), null(r.Uint64()),
		// FLOAT with at most 6 significant digits and DOUBLE with at most 12, so every
		// server prints them exactly.
		null(float64(r.IntN(2_000_000)-1_000_000) / 100), null(float64(r.Int64N(2e12)-1e12) / 1000),
		null(fmt.Sprintf("%d.%06d", r.Int64N(1e14)-5e13, r.IntN(1_000_000))),
		null(text()), null(text()), null(bin(8)), null(bin(32)),
		null(text()), null(text()), null(text()), null(text()),
		null(bin(40)), null(bin(200)), null(bin(300)), null(bin(400)),
		null(fmt.Sprintf("%04d-%02d-%02d", 1000+r.IntN(9000), 1+r.IntN(12), 1+r.IntN(28))),
		null(dt()), null(fmt.Sprintf("%s.%06d", dt(), r.IntN(1_000_000))),
		null(dt()), null(fmt.Sprintf("%s.%03d", dt(), r.IntN(1000))),
		null(fmt.Sprintf("%03d:%02d:%02d", r.IntN(839), r.IntN(60), r.IntN(60))),
		null(fmt.Sprintf("-%02d:%02d:%02d.%03d", r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1000))),
		null(int64(1901 + r.IntN(255))),
		null(uint64(1 + r.IntN(3))), null(uint64(r.IntN(8))), null(uint64(r.IntN(1024))),
		null(fmt.Sprintf(`{"k": %d, "s": "v%d", "a": [1, 2.5, null, true]}`, r.IntN(1000), r.IntN(100))),
	}
}

// keylessValues returns (a, b) from a small domain so duplicate rows are common.
func keylessValues(r *rand.Rand) []any {
	var a, b any
	if r.IntN(10) > 0 {
		a = int64(r.IntN(20))
	}
	if r.IntN(10) > 0 {
		b = fmt.Sprintf("v%d", r.IntN(5))
	}
	return []any{a, b}
}

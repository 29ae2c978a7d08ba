// Package reference is a frozen copy of cdc/open's decoder as it was before its
// allocations and its scanner were reworked for speed (issue 32): decode.go, scan.go,
// value.go, compress.go, errors.go and event.go of commit d434151, package name changed.
// It exists only as the oracle of open's FuzzDecodeReference and TestCorpusReference,
// which require the two decoders to return the same events and the same errors; it is
// not used by the program and is never changed (fix bugs in cdc/open, and here only if
// the fix changes what a record decodes to, with the test saying why).
package reference

// Kind says what an event is.
type Kind uint8

const (
	KindRow      Kind = 1 // a row change; wire type 1
	KindDDL      Kind = 2 // a DDL statement; wire type 2
	KindResolved Kind = 3 // a resolved ts (checkpoint broadcast); wire type 3
)

func (k Kind) String() string {
	switch k {
	case KindRow:
		return "row"
	case KindDDL:
		return "ddl"
	case KindResolved:
		return "resolved"
	}
	return "unknown"
}

// Op is the operation of a row event.
type Op uint8

const (
	OpInsert Op = 1
	OpUpdate Op = 2
	OpDelete Op = 3
)

func (o Op) String() string {
	switch o {
	case OpInsert:
		return "insert"
	case OpUpdate:
		return "update"
	case OpDelete:
		return "delete"
	}
	return "unknown"
}

// Flag is TiCDC's column flag bit set (the "f" field).
type Flag uint64

const (
	FlagBinary      Flag = 0x01 // column charset is binary (also set on all non-string types)
	FlagHandleKey   Flag = 0x02 // column is part of the handle key
	FlagGenerated   Flag = 0x04 // generated column: never written downstream
	FlagPrimaryKey  Flag = 0x08
	FlagUniqueKey   Flag = 0x10
	FlagMultipleKey Flag = 0x20
	FlagNullable    Flag = 0x40
	FlagUnsigned    Flag = 0x80
)

// MySQL column type codes carried in the "t" field.
const (
	TypeDecimal    byte = 0
	TypeTiny       byte = 1
	TypeShort      byte = 2
	TypeLong       byte = 3
	TypeFloat      byte = 4
	TypeDouble     byte = 5
	TypeNull       byte = 6
	TypeTimestamp  byte = 7
	TypeLonglong   byte = 8
	TypeInt24      byte = 9
	TypeDate       byte = 10
	TypeDuration   byte = 11
	TypeDatetime   byte = 12
	TypeYear       byte = 13
	TypeNewDate    byte = 14
	TypeVarchar    byte = 15
	TypeBit        byte = 16
	TypeJSON       byte = 245
	TypeNewDecimal byte = 246
	TypeEnum       byte = 247
	TypeSet        byte = 248
	TypeTinyBlob   byte = 249
	TypeMediumBlob byte = 250
	TypeLongBlob   byte = 251
	TypeBlob       byte = 252
	TypeVarString  byte = 253
	TypeString     byte = 254
	TypeGeometry   byte = 255
)

// Column is one column of a row event.
//
// Value holds a typed Go value that binds to go-sql-driver/mysql without loss:
//
//	nil      NULL (distinct from an empty string or empty []byte)
//	int64    signed integer types (TINYINT..BIGINT, YEAR)
//	uint64   unsigned integer types (flag 0x80), BIT, ENUM index, SET bitmask
//	float64  FLOAT and DOUBLE (a FLOAT holds the float32 value widened exactly)
//	string   DECIMAL (exact text), DATE/TIME/DATETIME/TIMESTAMP text, JSON text,
//	         and character columns (CHAR/VARCHAR/TEXT without the binary flag)
//	[]byte   binary columns (BINARY/VARBINARY/BLOB, binary flag set)
type Column struct {
	Name  string
	Type  byte
	Flags Flag
	Value any
}

// IsHandle reports whether the column is part of the handle key.
func (c Column) IsHandle() bool { return c.Flags&FlagHandleKey != 0 }

// IsGenerated reports whether the column is generated (never written downstream).
func (c Column) IsGenerated() bool { return c.Flags&FlagGenerated != 0 }

// Event is one decoded open-protocol event.
type Event struct {
	Kind     Kind
	CommitTs uint64 // commit ts of a row or DDL; the resolved ts of a resolved event

	Schema    string
	Table     string
	Partition int64 // physical partition ID of a partitioned table ("ptn"), else 0
	RowID     int64 // classic TiCDC's "rid" (informational only), else 0

	// Row events.
	Op         Op
	Columns    []Column // insert/update: the new row; delete: the deleted row
	OldColumns []Column // update: the old row when TiCDC sent it ("p"), else nil

	// Large-message handling ("ohk", "ccl"): the value carries only the handle-key
	// columns, or the whole message lives in a claim-check file at that location.
	OnlyHandleKey      bool
	ClaimCheckLocation string

	// DDL events.
	Query   string
	DDLType int // TiDB's model.ActionType

	// Malformed lists members of a row value that were not name→column objects and were
	// skipped, as "p.t". The new-architecture encoder writes them when a column changes
	// to NULL under only-output-updated-columns (its old value loses its name), so a
	// non-empty list means OldColumns is incomplete. Nil for well-formed messages.
	Malformed []string
}

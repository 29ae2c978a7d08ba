package loadgen

import (
	"fmt"
	"hash/crc32"
	"strconv"

	"github.com/tidb-parity/parity/cdc/open"
)

// Dispatcher names accepted by NewDispatcher, as in a changefeed's
// [[sink.dispatchers]] partition = "...".
const (
	DispatchTable      = "table"       // hash of schema and table: a table stays in one partition
	DispatchIndexValue = "index-value" // hash of schema, table and handle-key values: a row stays in one partition
	DispatchDefault    = "default"     // TiCDC's default: the same as "table" since tiflow #9224
	DispatchRowID      = "rowid"       // TiCDC's old alias of "index-value"
)

// Dispatcher chooses the Kafka partition of a row event the way TiCDC's Kafka sink does.
// It returns the partition and the partition key that groups events into one batch
// (TiCDC batches only events with the same partition key, cdc/sink/dmlsink/mq/worker.go).
type Dispatcher interface {
	Dispatch(ev *open.Event, partitions int) (partition int, key string)
}

// NewDispatcher returns the dispatcher with the given rule name.
func NewDispatcher(name string) (Dispatcher, error) {
	switch name {
	case DispatchTable, DispatchDefault, "":
		return tableDispatcher{}, nil
	case DispatchIndexValue, DispatchRowID:
		return indexValueDispatcher{}, nil
	}
	return nil, fmt.Errorf("unknown dispatcher %q (want %q or %q)", name, DispatchTable, DispatchIndexValue)
}

// positionInertia is TiCDC's partition hash (tiflow pkg/hash/position_inertia.go): every
// write hashes the concatenation of its parts with CRC-32 (IEEE) and XORs the result into
// the sum, which starts at 0. The XOR makes the order of writes irrelevant.
type positionInertia uint32

func (h *positionInertia) write(parts ...[]byte) {
	var crc uint32
	for _, p := range parts {
		crc = crc32.Update(crc, crc32.IEEETable, p)
	}
	*h ^= positionInertia(crc)
}

type tableDispatcher struct{}

func (tableDispatcher) Dispatch(ev *open.Event, partitions int) (int, string) {
	var h positionInertia
	h.write([]byte(ev.Schema), []byte(ev.Table))
	return int(uint32(h) % uint32(partitions)), ev.Schema + "." + ev.Table
}

type indexValueDispatcher struct{}

// Dispatch hashes schema and table, then each handle-key column's name and value string
// (tiflow partition/index_value.go). It uses the new row, or the old row of a delete. A
// table without a handle key hashes to its table's partition.
func (indexValueDispatcher) Dispatch(ev *open.Event, partitions int) (int, string) {
	var h positionInertia
	h.write([]byte(ev.Schema), []byte(ev.Table))
	for _, c := range ev.Columns {
		if c.IsHandle() {
			h.write([]byte(c.Name), []byte(ColumnValueString(c)))
		}
	}
	sum := uint32(h)
	return int(sum % uint32(partitions)), strconv.FormatInt(int64(sum), 10)
}

// ColumnValueString renders a column value the way TiCDC's model.ColumnValueString does for
// the Go value its mounter produces: NULL is "null", integers in decimal, FLOAT with
// float32 precision, DOUBLE with float64 precision, strings and bytes raw.
func ColumnValueString(c open.Column) string {
	switch v := c.Value.(type) {
	case nil:
		return "null"
	case int64:
		return strconv.FormatInt(v, 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	case float64:
		if c.Type == open.TypeFloat {
			return strconv.FormatFloat(v, 'f', -1, 32)
		}
		return strconv.FormatFloat(v, 'f', -1, 64)
	case string:
		return v
	case []byte:
		return string(v)
	case bool:
		if v {
			return "1"
		}
		return "0"
	}
	return fmt.Sprintf("%v", c.Value)
}

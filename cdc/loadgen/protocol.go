package loadgen

import (
	"errors"
	"fmt"
	"time"

	"github.com/tidb-parity/parity/cdc/open"
)

// Protocols loadgen publishes, named as in a TiCDC sink URI's protocol=.
const (
	ProtocolOpen   = "open-protocol" // TiCDC's open protocol (cdc/open's encoder)
	ProtocolCanal  = "canal-json"    // canal-json with enable-tidb-extension=true
	ProtocolSimple = "simple"        // simple, JSON, integrity-check-level = "correctness"
)

// Protocols lists the accepted protocol names.
var Protocols = []string{ProtocolOpen, ProtocolCanal, ProtocolSimple}

// TiCDC's simple bootstrap defaults: a table's BOOTSTRAP is sent again after this long or
// this many of its row messages (send-bootstrap-interval-in-sec, -in-msg-count).
const (
	bootstrapInterval = 120 * time.Second
	bootstrapMessages = 10000
)

// validateProtocol reports what does not go with the protocol: canal-json and simple
// records are plain JSON, one row each, with no compression and no large-message
// handling in loadgen (TiCDC has both; parity's decoders of these protocols take
// neither).
func validateProtocol(protocol string, enc open.EncoderConfig, tz string) error {
	switch protocol {
	case ProtocolOpen, "":
		return nil
	case ProtocolCanal, ProtocolSimple:
	default:
		return fmt.Errorf("unknown %q (want %s, %s or %s)", protocol, ProtocolOpen, ProtocolCanal, ProtocolSimple)
	}
	var errs []error
	if enc.Compression != "" && enc.Compression != open.CompressionNone {
		errs = append(errs, fmt.Errorf("compression %q is for open-protocol only", enc.Compression))
	}
	if enc.LargeMessageHandle != "" && enc.LargeMessageHandle != open.LargeMessageNone {
		errs = append(errs, fmt.Errorf("large-message-handle %q is for open-protocol only", enc.LargeMessageHandle))
	}
	if enc.Flavour == open.FlavourNewArch {
		errs = append(errs, errors.New("flavour newarch is for open-protocol only"))
	}
	if protocol == ProtocolSimple {
		if _, err := locationName(tz); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// wire encodes a changefeed's records in one protocol.
type wire interface {
	// rowBatch returns an encoder for the row records of one (topic, partition, key).
	rowBatch() (rowBatch, error)
	ddl(ev *open.Event) (open.Message, error)
	resolved(ts uint64) (open.Message, error)
	// ddlToAll says whether a DDL goes to every partition of its topic (open protocol,
	// simple) or to partition 0 only (canal-json).
	ddlToAll() bool
}

// rowBatch is what open.Encoder does for rows: append events, then take the records.
type rowBatch interface {
	AppendRow(ev *open.Event) error
	Build() []open.Message
}

// newWire returns the encoder of cfg.Protocol; tables gives canal-json and simple the
// definitions of the tables whose rows they encode.
func newWire(cfg *Config, tables func(schema, table string) (*wireTable, error)) (wire, error) {
	switch cfg.Protocol {
	case ProtocolCanal:
		return &jsonWire{max: maxMessageBytes(cfg), tables: tables, encode: encodeCanalRow}, nil
	case ProtocolSimple:
		loc, err := locationName(cfg.TimeZone)
		if err != nil {
			return nil, err
		}
		s := &simpleCoder{location: loc}
		return &jsonWire{max: maxMessageBytes(cfg), tables: tables, encode: s.encodeRow, simple: true}, nil
	}
	enc, err := open.NewEncoder(cfg.Encoder)
	if err != nil {
		return nil, err
	}
	return &openWire{cfg: cfg.Encoder, enc: enc}, nil
}

func maxMessageBytes(cfg *Config) int {
	if cfg.Encoder.MaxMessageBytes > 0 {
		return cfg.Encoder.MaxMessageBytes
	}
	return open.DefaultEncoderConfig().MaxMessageBytes
}

type openWire struct {
	cfg open.EncoderConfig
	enc *open.Encoder // DDL and resolved records
}

func (w *openWire) rowBatch() (rowBatch, error)              { return open.NewEncoder(w.cfg) }
func (w *openWire) ddl(ev *open.Event) (open.Message, error) { return w.enc.EncodeDDL(ev) }
func (w *openWire) resolved(ts uint64) (open.Message, error) { return w.enc.EncodeResolved(ts), nil }
func (w *openWire) ddlToAll() bool                           { return true }

// jsonWire is canal-json or simple: one JSON message per row, an empty key.
type jsonWire struct {
	max    int
	tables func(schema, table string) (*wireTable, error)
	encode func(ev *open.Event, t *wireTable) ([]byte, error)
	simple bool
}

func (w *jsonWire) rowBatch() (rowBatch, error) { return &jsonRows{w: w}, nil }

func (w *jsonWire) ddl(ev *open.Event) (open.Message, error) {
	var v []byte
	var err error
	if !w.simple {
		v, err = encodeCanalDDL(ev)
	} else {
		var t *wireTable
		if ev.DDLType == ddlCreateTable {
			if t, err = w.tables(ev.Schema, ev.Table); err != nil {
				return open.Message{}, err
			}
		}
		v, err = encodeSimpleDDL(ev, t)
	}
	return open.Message{Value: v}, err
}

func (w *jsonWire) resolved(ts uint64) (open.Message, error) {
	if w.simple {
		return open.Message{Value: encodeSimpleWatermark(ts)}, nil
	}
	return open.Message{Value: encodeCanalWatermark(ts)}, nil
}

func (w *jsonWire) ddlToAll() bool { return w.simple }

type jsonRows struct {
	w    *jsonWire
	msgs []open.Message
}

func (r *jsonRows) AppendRow(ev *open.Event) error {
	t, err := r.w.tables(ev.Schema, ev.Table)
	if err != nil {
		return err
	}
	v, err := r.w.encode(ev, t)
	if err != nil {
		return err
	}
	if m := (open.Message{Value: v, Events: 1}); m.Length() > r.w.max {
		return fmt.Errorf("%w: %d bytes, max-message-bytes %d", open.ErrMessageTooLarge, m.Length(), r.w.max)
	}
	r.msgs = append(r.msgs, open.Message{Value: v, Events: 1})
	return nil
}

func (r *jsonRows) Build() []open.Message {
	out := r.msgs
	r.msgs = nil
	return out
}

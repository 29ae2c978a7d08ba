package cdc

// consume.go reads the changefeed: one reader per partition fetches Kafka records, decodes
// them (claim-check files included), rejects events the applier cannot apply and hands
// each record to the coordinator; kafkaTransient decides which read errors are waited out.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/canal"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/simple"
	"github.com/tidb-parity/parity/internal/retry"
)

// recordDecoder turns one Kafka record of the changefeed into its events, in the open
// protocol's event model whatever the protocol (changefeed.protocol picks it), so that
// everything after the reader is the same for every protocol. An error names what could
// not be decoded; the reader adds topic, partition and offset.
type recordDecoder interface {
	Decode(key, value []byte) ([]open.Event, error)
}

var (
	_ recordDecoder = (*open.Decoder)(nil)
	_ recordDecoder = (*canal.Decoder)(nil)
	_ recordDecoder = (*simple.Decoder)(nil)
)

// newRecordDecoder returns the decoder of the changefeed's protocol.
func newRecordDecoder(cfg Config) (recordDecoder, error) {
	switch cfg.Changefeed.Protocol {
	case ProtocolCanal:
		return canal.NewDecoder(canal.DecoderConfig{MaxMessageBytes: cfg.Changefeed.MaxMessageBytes})
	case ProtocolSimple:
		// TIMESTAMP text as TiCDC rendered it: changefeed.time-zone is TiCDC's zone, the
		// apply sessions' time_zone.
		return simple.NewDecoder(simple.DecoderConfig{})
	case ProtocolOpen, "":
		return open.NewDecoder(open.DecoderConfig{
			Compression:     open.Compression(cfg.Changefeed.Compression),
			ClaimCheck:      claimCheckLoader(cfg.Changefeed.ClaimCheckDir),
			MaxPayloadBytes: cfg.Changefeed.MaxMessageBytes,
		})
	}
	return nil, fmt.Errorf("changefeed.protocol: %w", validProtocol(cfg.Changefeed.Protocol))
}

// record is one Kafka record handed from a partition reader to the coordinator.
type record struct {
	part   int
	offset int64
	hw     int64
	key    []byte
	value  []byte
	events []open.Event
	err    error
}

func claimCheckLoader(dir string) func(string) ([]byte, error) {
	if dir == "" {
		return nil
	}
	return func(loc string) ([]byte, error) {
		return os.ReadFile(filepath.Join(dir, open.ClaimCheckFileName(loc)))
	}
}

// consume reads one partition from start (-1: the first offset) and hands decoded
// records to the coordinator. It never commits offsets to Kafka: progress lives in the
// meta schema.
func (r *Replicator) consume(ctx context.Context, dec recordDecoder, schemas *streamSchemas, gate *readGate, idx int, pk partKey, start int64, out chan<- record) error {
	dialer := r.kafka.Dialer(10 * time.Second)
	dialer.DialFunc = bufferedReads(dialer.DialFunc)
	rd := kafka.NewReader(kafka.ReaderConfig{
		Brokers:         r.cfg.Changefeed.Brokers,
		Dialer:          dialer,
		Topic:           pk.Topic,
		Partition:       pk.Partition,
		MinBytes:        1,
		MaxBytes:        32 << 20,
		MaxWait:         1500 * time.Millisecond, // the broker answers as soon as data arrives; must exceed kafka-go's 1s RTT allowance, and bounds Close
		ReadLagInterval: -1,
		// Never let the reader jump over records deleted by retention: fail instead.
		OffsetOutOfRangeError: true,
		ErrorLogger: kafka.LoggerFunc(func(f string, a ...any) {
			if ctx.Err() == nil { // errors while stopping are expected
				r.log.Warn("kafka reader", "partition", pk.String(), "msg", fmt.Sprintf(f, a...))
			}
		}),
	})
	defer rd.Close()
	if start < 0 {
		start = kafka.FirstOffset
	}
	if err := rd.SetOffset(start); err != nil {
		return fmt.Errorf("seeking %s to %d: %w", pk, start, err)
	}
	tables := tableCache{}     // upstream tables of this partition's handle-key-only events
	var failingSince time.Time // the first of consecutive transient read errors
	for {
		if gate.wait(ctx, idx) != nil {
			return nil
		}
		msg, err := rd.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			// kafka-go's reader reconnects by itself (with backoff, from the next offset)
			// but reports the errors of its attempts: transient ones are waited out for
			// changefeed.retry-timeout.
			if kafkaTransient(err) {
				now := time.Now()
				if failingSince.IsZero() {
					failingSince = now
				}
				if d := now.Sub(failingSince); d < r.cfg.Changefeed.RetryTimeout {
					r.log.Warn("kafka unavailable; reconnecting", "partition", pk.String(), "failing_for", d.Round(time.Millisecond), "err", err)
					continue
				}
				return fmt.Errorf("reading %s: kafka unavailable for %v (changefeed.retry-timeout %v): %w",
					pk, now.Sub(failingSince).Round(time.Second), r.cfg.Changefeed.RetryTimeout, r.kafka.Explain(err))
			}
			return fmt.Errorf("reading %s: %w", pk, r.kafka.Explain(err))
		}
		failingSince = time.Time{}
		rec := record{part: idx, offset: msg.Offset, hw: msg.HighWaterMark}
		rec.events, err = dec.Decode(msg.Key, msg.Value)
		if err == nil && schemas != nil {
			// Keys and generated columns from the tables' definitions (streamschema.go).
			if err = schemas.complete(ctx, pk, rec.events); err != nil {
				var fe *schemaReadError
				if ctx.Err() != nil {
					return nil
				}
				if errors.As(err, &fe) { // not the record's fault: stop, read it again after a restart
					return fmt.Errorf("%s offset %d: %w", pk, msg.Offset, err)
				}
			}
		}
		if err == nil {
			err = checkEvents(rec.events, r.rows != nil)
		}
		if err == nil && r.rows != nil {
			// Not a record error (the record is fine): stop, and read it again after a restart.
			if err := r.rows.complete(ctx, rec.events, tables); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("%s offset %d: %w", pk, msg.Offset, err)
			}
		}
		if err != nil {
			rec.events = nil
			rec.key, rec.value = msg.Key, msg.Value
			rec.err = &RecordError{Topic: pk.Topic, Partition: pk.Partition, Offset: msg.Offset, Err: open.WithRecord(err, pk.Topic, pk.Partition, msg.Offset)}
		}
		select {
		case out <- rec:
			gate.passed(idx, rec.events)
		case <-ctx.Done():
			return nil
		}
	}
}

// kafkaTransient reports whether a read error is worth waiting out: a broker's
// retriable error code, or the network (refused, reset, timed out, closed). Other Kafka
// errors (an offset out of range: records deleted by retention) are not.
func kafkaTransient(err error) bool {
	var (
		cv *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		hn x509.HostnameError
		ci x509.CertificateInvalidError
		al tls.AlertError
		ra *tls.RecordHeaderError
	)
	if errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) || errors.As(err, &al) || errors.As(err, &ra) {
		return false // TLS refused: waiting does not help
	}
	var ke kafka.Error
	if errors.As(err, &ke) {
		return ke.Temporary()
	}
	return retry.Classify(err) == retry.Connection
}

// checkEvents rejects events the applier cannot apply correctly. fetch says whether
// handle-key-only inserts and updates can be completed from the upstream.
func checkEvents(evs []open.Event, fetch bool) error {
	for i := range evs {
		ev := &evs[i]
		if ev.Kind == open.KindRow && ev.OnlyHandleKey && ev.Op != open.OpDelete && !fetch {
			return fmt.Errorf("event %d (%s of %s.%s, commit ts %d) carries only handle-key columns (TiCDC large-message-handle-option handle-key-only): set upstream.dsn so parity can read the row from TiDB", i, ev.Op, ev.Schema, ev.Table, ev.CommitTs)
		}
		if ev.Kind == open.KindRow && ev.Table == "" {
			return fmt.Errorf("row event %d has no table", i)
		}
	}
	return nil
}

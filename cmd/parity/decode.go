package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/spf13/cobra"

	"github.com/tidb-parity/parity/cdc/canal"
	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/cdc/simple"
	"github.com/tidb-parity/parity/internal/tlsauth"
)

// recordDecoder decodes one record of the protocol --protocol names into events.
type recordDecoder interface {
	Decode(key, value []byte) ([]open.Event, error)
}

var (
	_ recordDecoder = (*open.Decoder)(nil)
	_ recordDecoder = (*canal.Decoder)(nil)
	_ recordDecoder = (*simple.Decoder)(nil)
)

// Exit codes of `parity decode` (the rule of every command: exitClean and the others).
const (
	decodeExitUndecodable = exitNotClean // a record could not be decoded (the error names it)
	decodeExitUsage       = exitNoAnswer // bad flags, unreadable files, Kafka unreachable
)

// decodeOptions are the flags of `parity decode`.
type decodeOptions struct {
	keyFile, valueFile string
	schemaFiles        []string // simple: DDL or BOOTSTRAP records learned before the value
	protocol           string
	compression        string
	claimCheckDir      string

	brokers   string
	topic     string
	partition int
	offset    string
	limit     int
	timeout   time.Duration
	tls       tlsauth.TLS
	sasl      tlsauth.SASL
}

func init() {
	addCommand(newDecodeCommand)
}

func newDecodeCommand() *cobra.Command {
	var o decodeOptions
	cmd := &cobra.Command{
		Use:   "decode",
		Short: "Print TiCDC open-protocol, canal-json or simple records as JSON lines, one per event",
		Long: `Decode TiCDC Kafka records (--protocol open-protocol, canal-json or simple) and print
one JSON object per event (format: docs/decode.md). canal-json and simple records are
read from their value alone: give --value-file without --key-file. A simple row record is
typed by its table's schema, which DDL and BOOTSTRAP records carry: give those as
--schema-file (from Kafka they are learned from the partition's records before --offset).
Every simple row's checksum is verified.

Read one record from files:
  parity decode --key-file key.bin --value-file value.bin [--compression snappy] [--claim-check-dir DIR]
  parity decode --protocol canal-json --value-file value.json
  parity decode --protocol simple --schema-file bootstrap.json --value-file row.json

or consume a topic from Kafka, from --offset up to the end of each partition as it was
when the command started (at most --limit records):
  parity decode --brokers host:9092 --topic cdc [--partition 0] [--offset first|N] [--limit 10]

Exit status: 0 when every record decoded, 1 when a record could not be decoded (the
error names the record and where in it), 2 on bad flags or I/O errors.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
			defer stop()
			saslPasswordFromEnv(&o.sasl)
			return runDecode(ctx, o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.protocol, "protocol", "open-protocol", "the changefeed's protocol: open-protocol, canal-json or simple")
	f.StringArrayVar(&o.schemaFiles, "schema-file", nil, "simple: a DDL or BOOTSTRAP record (file) whose table schema the value's rows need (repeatable)")
	f.StringVar(&o.keyFile, "key-file", "", "file holding one Kafka record key")
	f.StringVar(&o.valueFile, "value-file", "", "file holding the record's value")
	f.StringVar(&o.compression, "compression", "none", "payload compression the changefeed uses (large-message-handle-compression): none, snappy or lz4")
	f.StringVar(&o.claimCheckDir, "claim-check-dir", "", "directory holding claim-check objects (<uuid>.json); needed for claim-check records")
	f.StringVar(&o.brokers, "brokers", "", "Kafka bootstrap brokers, comma-separated")
	f.StringVar(&o.topic, "topic", "", "Kafka topic to read")
	f.IntVar(&o.partition, "partition", -1, "partition to read (default: all, in order)")
	f.StringVar(&o.offset, "offset", "first", "offset to start at in each partition: first, or a number")
	f.IntVar(&o.limit, "limit", 0, "stop after this many records (0: read to the end)")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "timeout for each Kafka request")
	addTLSFlags(f, "kafka", "Kafka", &o.tls)
	addSASLFlags(f, &o.sasl)
	return cmd
}

// validate reports every problem with the flags.
func (o decodeOptions) validate() error {
	var errs []error
	files := o.keyFile != "" || o.valueFile != ""
	kafkaMode := o.brokers != "" || o.topic != ""
	switch {
	case files && kafkaMode:
		errs = append(errs, errors.New("--key-file/--value-file and --brokers/--topic are exclusive"))
	case files:
		if o.valueFile == "" || (o.keyFile == "" && o.protocol == "open-protocol") {
			errs = append(errs, errors.New("--key-file and --value-file go together"))
		}
	case kafkaMode:
		if o.brokers == "" || o.topic == "" {
			errs = append(errs, errors.New("--brokers and --topic go together"))
		}
	default:
		errs = append(errs, errors.New("give --key-file and --value-file, or --brokers and --topic"))
	}
	switch o.protocol {
	case "open-protocol":
	case "canal-json", "simple":
		if o.compression != "none" || o.claimCheckDir != "" {
			errs = append(errs, errors.New("--compression and --claim-check-dir are the open protocol's"))
		}
	default:
		errs = append(errs, fmt.Errorf("--protocol: want open-protocol, canal-json or simple, got %q", o.protocol))
	}
	if len(o.schemaFiles) > 0 && (o.protocol != "simple" || kafkaMode) {
		errs = append(errs, errors.New("--schema-file: only with --protocol simple and --value-file (from Kafka the schemas are learned from the partition)"))
	}
	if err := open.Compression(o.compression).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("--compression: %w", err))
	}
	if err := o.tls.Validate("kafka-tls"); err != nil {
		errs = append(errs, err)
	}
	if err := o.sasl.Validate("kafka-sasl", o.tls.On()); err != nil {
		errs = append(errs, err)
	}
	if o.offset != "first" {
		if n, err := strconv.ParseInt(o.offset, 10, 64); err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("--offset: want first or a non-negative number, got %q", o.offset))
		}
	}
	if o.limit < 0 {
		errs = append(errs, fmt.Errorf("--limit: must not be negative, got %d", o.limit))
	}
	if o.partition < -1 {
		errs = append(errs, fmt.Errorf("--partition: must not be negative, got %d", o.partition))
	}
	if o.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout: must be positive, got %s", o.timeout))
	}
	return errors.Join(errs...)
}

func runDecode(ctx context.Context, o decodeOptions, out io.Writer) error {
	if err := o.validate(); err != nil {
		return &exitError{decodeExitUsage, err}
	}
	var dec recordDecoder
	var err error
	switch o.protocol {
	case "canal-json":
		dec, err = canal.NewDecoder(canal.DecoderConfig{})
	case "simple":
		dec, err = simple.NewDecoder(simple.DecoderConfig{})
	default:
		dec, err = open.NewDecoder(open.DecoderConfig{
			Compression: open.Compression(o.compression),
			ClaimCheck:  claimCheckLoader(o.claimCheckDir),
		})
	}
	if err != nil {
		return &exitError{decodeExitUsage, err}
	}
	w := bufio.NewWriter(out)
	if o.valueFile != "" {
		err = decodeFiles(dec, o, w)
	} else {
		err = decodeTopic(ctx, dec, o, w)
	}
	if ferr := w.Flush(); err == nil && ferr != nil {
		err = &exitError{decodeExitUsage, fmt.Errorf("write output: %w", ferr)}
	}
	return err
}

// claimCheckLoader resolves a claim-check location to <dir>/<object name>, as TiCDC's
// consumer does with its configured storage. Without a directory it returns nil, so a
// claim-check record is an error that says what is missing.
func claimCheckLoader(dir string) func(string) ([]byte, error) {
	if dir == "" {
		return nil
	}
	return func(location string) ([]byte, error) {
		name := open.ClaimCheckFileName(location)
		if name == "" || name == "." || name == ".." {
			return nil, fmt.Errorf("claim-check location %q has no object name", location)
		}
		return os.ReadFile(filepath.Join(dir, name))
	}
}

func decodeFiles(dec recordDecoder, o decodeOptions, w *bufio.Writer) error {
	var key []byte
	var err error
	if sd, ok := dec.(*simple.Decoder); ok {
		for _, f := range o.schemaFiles {
			b, err := os.ReadFile(f)
			if err != nil {
				return &exitError{decodeExitUsage, fmt.Errorf("read schema: %w", err)}
			}
			if ok, err := sd.LearnSchema(b); err != nil {
				return &exitError{decodeExitUndecodable, fmt.Errorf("%s: %w", f, err)}
			} else if !ok {
				return &exitError{decodeExitUsage, fmt.Errorf("--schema-file %s: not a DDL or BOOTSTRAP record", f)}
			}
		}
	}
	if o.keyFile != "" {
		if key, err = os.ReadFile(o.keyFile); err != nil {
			return &exitError{decodeExitUsage, fmt.Errorf("read key: %w", err)}
		}
	}
	value, err := os.ReadFile(o.valueFile)
	if err != nil {
		return &exitError{decodeExitUsage, fmt.Errorf("read value: %w", err)}
	}
	evs, err := dec.Decode(key, value)
	if err != nil {
		name := o.valueFile
		if o.keyFile != "" {
			name = o.keyFile + " + " + o.valueFile
		}
		return &exitError{decodeExitUndecodable, fmt.Errorf("%s: %w%s", name, err, hint(err, o))}
	}
	return writeEvents(w, evs, nil)
}

func writeEvents(w *bufio.Writer, evs []open.Event, rec *open.RecordRef) error {
	var line []byte
	for i := range evs {
		if rec != nil {
			rec.Index = i
		}
		line = open.AppendJSONLine(line[:0], &evs[i], rec)
		if _, err := w.Write(line); err != nil {
			return &exitError{decodeExitUsage, fmt.Errorf("write output: %w", err)}
		}
	}
	return nil
}

// decodeTopic reads the selected partitions in order, each from the start offset to the
// high watermark it had when the command started, and prints every event. The first
// record that does not decode stops the command with its coordinates.
func decodeTopic(ctx context.Context, dec recordDecoder, o decodeOptions, w *bufio.Writer) error {
	k, err := tlsauth.NewKafka("kafka", o.tls, o.sasl)
	if err != nil {
		return &exitError{decodeExitUsage, err}
	}
	dialer := k.Dialer(o.timeout)
	brokers := strings.Split(o.brokers, ",")
	var (
		conn   *kafka.Conn
		broker string
	)
	for _, b := range brokers {
		broker = strings.TrimSpace(b)
		if conn, err = dialer.DialContext(ctx, "tcp", broker); err == nil {
			break
		}
	}
	if err != nil {
		return &exitError{decodeExitUsage, fmt.Errorf("dial kafka %s: %w", o.brokers, k.Explain(err))}
	}
	parts, err := conn.ReadPartitions(o.topic)
	conn.Close()
	if err != nil {
		return &exitError{decodeExitUsage, fmt.Errorf("topic %s: read partitions: %w", o.topic, err)}
	}
	var ids []int
	for _, p := range parts {
		if p.Topic == o.topic && (o.partition < 0 || p.ID == o.partition) {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) == 0 {
		return &exitError{decodeExitUsage, fmt.Errorf("topic %s has no partition %d", o.topic, o.partition)}
	}
	slices.Sort(ids)
	remaining := o.limit
	for _, id := range ids {
		n, err := decodePartition(ctx, dialer, dec, o, broker, id, remaining, w)
		if err != nil {
			return err
		}
		if o.limit > 0 {
			if remaining -= n; remaining <= 0 {
				break
			}
		}
	}
	return nil
}

// decodePartition prints the records of one partition and returns how many it read.
func decodePartition(ctx context.Context, dialer *kafka.Dialer, dec recordDecoder, o decodeOptions,
	broker string, partition, limit int, w *bufio.Writer) (int, error) {
	conn, err := dialer.DialLeader(ctx, "tcp", broker, o.topic, partition)
	if err != nil {
		return 0, &exitError{decodeExitUsage, fmt.Errorf("topic %s partition %d: dial leader: %w", o.topic, partition, err)}
	}
	defer conn.Close()
	first, last, err := conn.ReadOffsets()
	if err != nil {
		return 0, &exitError{decodeExitUsage, fmt.Errorf("topic %s partition %d: read offsets: %w", o.topic, partition, err)}
	}
	start := first
	if o.offset != "first" {
		start, _ = strconv.ParseInt(o.offset, 10, 64)
		if start < first {
			return 0, &exitError{decodeExitUsage, fmt.Errorf("topic %s partition %d: offset %d is gone, the first offset is %d", o.topic, partition, start, first)}
		}
	}
	if start >= last {
		return 0, nil
	}
	if sd, ok := dec.(*simple.Decoder); ok && start > first {
		if err := learnSchemas(ctx, conn, sd, o, partition, first, start); err != nil {
			return 0, err
		}
	}
	if _, err := conn.Seek(start, kafka.SeekAbsolute); err != nil {
		return 0, &exitError{decodeExitUsage, fmt.Errorf("topic %s partition %d: seek %d: %w", o.topic, partition, start, err)}
	}
	n := 0
	next := start
	for next < last && (limit == 0 || n < limit) {
		if err := ctx.Err(); err != nil {
			return n, &exitError{decodeExitUsage, err}
		}
		_ = conn.SetReadDeadline(time.Now().Add(o.timeout))
		batch := conn.ReadBatch(1, 64<<20)
		before := next
		for next < last && (limit == 0 || n < limit) {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			n++
			next = m.Offset + 1
			evs, err := dec.Decode(m.Key, m.Value)
			if err != nil {
				batch.Close()
				err = withRecord(err, o, partition, m.Offset)
				if h := hint(err, o); h != "" {
					err = fmt.Errorf("%w%s", err, h)
				}
				return n, &exitError{decodeExitUndecodable, err}
			}
			if err := writeEvents(w, evs, &open.RecordRef{Topic: o.topic, Partition: partition, Offset: m.Offset}); err != nil {
				batch.Close()
				return n, err
			}
		}
		if err := batch.Close(); err != nil && next < last && (limit == 0 || n < limit) {
			return n, &exitError{decodeExitUsage, fmt.Errorf("topic %s partition %d: read at offset %d: %w", o.topic, partition, next, err)}
		}
		if next == before {
			// Nothing readable before the high watermark (e.g. only control records
			// remain): skip to where the connection is, or stop if it did not move.
			if off, _ := conn.Offset(); off > next {
				next = off
				continue
			}
			return n, &exitError{decodeExitUsage, fmt.Errorf("topic %s partition %d: no record readable at offset %d before the end %d", o.topic, partition, next, last)}
		}
	}
	return n, nil
}

// withRecord names the Kafka record in a decoder's error.
func withRecord(err error, o decodeOptions, partition int, offset int64) error {
	switch o.protocol {
	case "canal-json":
		return fmt.Errorf("topic %s partition %d offset %d: %w", o.topic, partition, offset, err)
	case "simple":
		var de *simple.DecodeError
		var ce *simple.ChecksumError
		if errors.As(err, &de) || errors.As(err, &ce) {
			return simple.WithRecord(err, o.topic, partition, offset)
		}
		return fmt.Errorf("topic %s partition %d offset %d: %w", o.topic, partition, offset, err)
	}
	return open.WithRecord(err, o.topic, partition, offset)
}

// learnSchemas reads the partition's records from first up to start and gives those
// that carry table schemas (DDL, BOOTSTRAP) to the simple decoder, so that the rows
// from start on decode: the table schemas of simple's row records come before them.
func learnSchemas(ctx context.Context, conn *kafka.Conn, sd *simple.Decoder, o decodeOptions, partition int, first, start int64) error {
	if _, err := conn.Seek(first, kafka.SeekAbsolute); err != nil {
		return &exitError{decodeExitUsage, fmt.Errorf("topic %s partition %d: seek %d: %w", o.topic, partition, first, err)}
	}
	next := first
	for next < start {
		if err := ctx.Err(); err != nil {
			return &exitError{decodeExitUsage, err}
		}
		_ = conn.SetReadDeadline(time.Now().Add(o.timeout))
		batch := conn.ReadBatch(1, 64<<20)
		before := next
		for next < start {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			next = m.Offset + 1
			if m.Offset >= start {
				break
			}
			if _, err := sd.LearnSchema(m.Value); err != nil {
				batch.Close()
				return &exitError{decodeExitUndecodable, withRecord(fmt.Errorf("learning the table schemas before offset %d: %w", start, err), o, partition, m.Offset)}
			}
		}
		if err := batch.Close(); err != nil && next < start {
			return &exitError{decodeExitUsage, fmt.Errorf("topic %s partition %d: read at offset %d: %w", o.topic, partition, next, err)}
		}
		if next == before {
			return &exitError{decodeExitUsage, fmt.Errorf("topic %s partition %d: no record readable at offset %d before %d", o.topic, partition, next, start)}
		}
	}
	return nil
}

// hint suggests the flag that is probably missing for an error.
func hint(err error, o decodeOptions) string {
	switch {
	case errors.Is(err, simple.ErrNoSchema) && o.valueFile != "":
		return " (give the table's BOOTSTRAP or DDL record as --schema-file)"
	case errors.Is(err, open.ErrClaimCheck) && o.claimCheckDir == "":
		return " (give --claim-check-dir)"
	case (errors.Is(err, open.ErrSyntax) || errors.Is(err, open.ErrCompression)) && o.compression != "none":
		return " (is --compression " + o.compression + " what the changefeed uses?)"
	case errors.Is(err, open.ErrSyntax):
		return " (if the changefeed sets large-message-handle-compression, give --compression)"
	}
	return ""
}

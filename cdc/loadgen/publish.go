package loadgen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/cdc/open"
	"github.com/tidb-parity/parity/internal/tlsauth"
)

// txn is one committed upstream transaction waiting to be published.
type txn struct {
	commitTs uint64
	events   []*open.Event
}

// sequencer keeps the resolved-ts invariant while workers commit concurrently.
//
// A worker registers itself (begin) immediately before it sends COMMIT, with a lower
// bound lb: the most recent TSO the publisher fetched. That TSO was allocated before the
// registration, the registration happens before COMMIT is sent, and TiDB allocates a 2PC
// commit ts only after COMMIT arrives (async commit and 1PC are switched off for the
// session), so lb < commit ts.
//
// Each round the publisher fetches a fresh TSO N, then under the lock computes
// B = min(N, lb of every registered worker) and takes every committed transaction with
// commit ts ≤ B. Any transaction with commit ts c ≤ B < N had its commit ts allocated
// before N, so its worker registered before the lock was taken: it is either still
// registered (then lb < c, and B ≤ lb < c contradicts c ≤ B), or already handed over
// (taken now, or earlier and already acknowledged). Hence once the taken transactions
// are acknowledged by Kafka, every transaction with commit ts ≤ B is in Kafka and B may
// be published as a resolved ts.
type sequencer struct {
	mu         sync.Mutex
	nextToken  uint64
	committing map[uint64]uint64 // token -> lower bound of its commit ts
	pending    []*txn
	lastTSO    atomic.Uint64
	wake       chan struct{}
}

func newSequencer(start uint64) *sequencer {
	s := &sequencer{committing: map[uint64]uint64{}, wake: make(chan struct{}, 1)}
	s.lastTSO.Store(start)
	return s
}

// begin registers a transaction about to commit; it returns its token and lower bound.
func (s *sequencer) begin() (token, lb uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextToken++
	lb = s.lastTSO.Load()
	s.committing[s.nextToken] = lb
	return s.nextToken, lb
}

// committed hands over a committed transaction.
func (s *sequencer) committed(token uint64, t *txn) {
	s.mu.Lock()
	delete(s.committing, token)
	s.pending = append(s.pending, t)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// abort forgets a transaction whose COMMIT failed or that wrote nothing.
func (s *sequencer) abort(token uint64) {
	s.mu.Lock()
	delete(s.committing, token)
	s.mu.Unlock()
}

// take returns, in commit-ts order, the committed transactions that may be published
// given a fresh TSO n, and the bound B up to which everything is then published.
func (s *sequencer) take(n uint64) ([]*txn, uint64) {
	s.lastTSO.Store(n)
	s.mu.Lock()
	defer s.mu.Unlock()
	bound := n
	for _, lb := range s.committing {
		bound = min(bound, lb)
	}
	var out, keep []*txn
	for _, t := range s.pending {
		if t.commitTs <= bound {
			out = append(out, t)
		} else {
			keep = append(keep, t)
		}
	}
	s.pending = keep
	slices.SortStableFunc(out, func(a, b *txn) int {
		switch {
		case a.commitTs < b.commitTs:
			return -1
		case a.commitTs > b.commitTs:
			return 1
		}
		return 0
	})
	return out, bound
}

// inflight reports how many transactions are registered or waiting.
func (s *sequencer) inflight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.committing) + len(s.pending)
}

// producer writes the changefeed's records (in its protocol) to explicit partitions of
// its topics: one, or one per schema (a {schema} topic expression).
type producer struct {
	w          *kafka.Writer
	transport  *kafka.Transport
	log        *slog.Logger
	topics     []*outTopic          // distinct, in the order of their first schema
	bySchema   map[string]*outTopic // every schema of the configuration
	dispatcher Dispatcher
	wire       wire
	// tables are the definitions canal-json and simple need, by schema.table.
	tables map[string]*wireTable
	// boot is simple's BOOTSTRAP state per topic and table: when it was last sent and
	// how many row messages of the table followed.
	boot map[string]*bootState
}

type bootState struct {
	at   time.Time
	rows int
}

// outTopic is one topic the producer writes and its partition count.
type outTopic struct {
	name       string
	partitions int
}

// topicOf returns the topic of a schema's events.
func (p *producer) topicOf(schema string) (*outTopic, error) {
	t := p.bySchema[schema]
	if t == nil {
		return nil, fmt.Errorf("schema %s has no topic (not one of the configured schemas)", schema)
	}
	return t, nil
}

// allPartitions is the number of partitions over every topic: the records of one
// resolved-ts broadcast.
func (p *producer) allPartitions() int {
	n := 0
	for _, t := range p.topics {
		n += t.partitions
	}
	return n
}

// partitionBalancer routes a message to the partition already set on it.
var partitionBalancer = kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition })

// TopicPartitions returns the number of partitions of a topic.
func TopicPartitions(ctx context.Context, brokers []string, topic string) (int, error) {
	return topicPartitions(ctx, nil, brokers, topic)
}

// topicPartitions is TopicPartitions over k's TLS and SASL (nil: neither).
func topicPartitions(ctx context.Context, k *tlsauth.Kafka, brokers []string, topic string) (int, error) {
	d := k.Dialer(10 * time.Second)
	var lastErr error
	for _, b := range brokers {
		conn, err := d.DialContext(ctx, "tcp", b)
		if err != nil {
			lastErr = err
			continue
		}
		parts, err := conn.ReadPartitions(topic)
		conn.Close()
		if err != nil {
			return 0, fmt.Errorf("read partitions of topic %s: %w", topic, k.Explain(err))
		}
		if len(parts) == 0 {
			return 0, fmt.Errorf("topic %s has no partitions", topic)
		}
		return len(parts), nil
	}
	return 0, fmt.Errorf("dial kafka %v: %w", brokers, k.Explain(lastErr))
}

// CreateTopic creates a topic with the given partitions (replication factor 1) and
// waits until every partition has a leader.
func CreateTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	return createTopic(ctx, nil, brokers, topic, partitions)
}

// createTopic is CreateTopic over k's TLS and SASL (nil: neither).
func createTopic(ctx context.Context, k *tlsauth.Kafka, brokers []string, topic string, partitions int) error {
	d := k.Dialer(10 * time.Second)
	conn, err := d.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return fmt.Errorf("dial kafka %s: %w", brokers[0], k.Explain(err))
	}
	defer conn.Close()
	ctrl, err := conn.Controller()
	if err != nil {
		return fmt.Errorf("kafka controller: %w", err)
	}
	cc, err := d.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port)))
	if err != nil {
		return fmt.Errorf("dial kafka controller: %w", err)
	}
	defer cc.Close()
	err = cc.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1})
	if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	for {
		c, err := d.DialContext(ctx, "tcp", brokers[0])
		if err == nil {
			parts, err := c.ReadPartitions(topic)
			c.Close()
			ready := err == nil && len(parts) == partitions
			for _, p := range parts {
				if p.Leader.Host == "" {
					ready = false
				}
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s has no leaders yet: %w", topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// newProducer returns a producer of cfg's topics; tables are the definitions canal-json
// and simple need (nil for the open protocol).
func newProducer(ctx context.Context, cfg *Config, tables map[string]*wireTable) (*producer, error) {
	k, err := tlsauth.NewKafka("kafka", cfg.KafkaTLS, cfg.KafkaSASL)
	if err != nil {
		return nil, err
	}
	p := &producer{log: cfg.Logger, bySchema: map[string]*outTopic{}, tables: tables, boot: map[string]*bootState{}}
	for _, schema := range cfg.Schemas() {
		name := cfg.TopicOf(schema)
		i := slices.IndexFunc(p.topics, func(t *outTopic) bool { return t.name == name })
		if i < 0 {
			n, err := ensureTopic(ctx, k, cfg, name)
			if err != nil {
				return nil, err
			}
			p.topics = append(p.topics, &outTopic{name: name, partitions: n})
			i = len(p.topics) - 1
		}
		p.bySchema[schema] = p.topics[i]
	}
	if p.dispatcher, err = NewDispatcher(cfg.Dispatcher); err != nil {
		return nil, err
	}
	if p.wire, err = newWire(cfg, p.table); err != nil {
		return nil, err
	}
	maxBytes := cfg.Encoder.MaxMessageBytes
	if maxBytes == 0 {
		maxBytes = open.DefaultEncoderConfig().MaxMessageBytes
	}
	p.transport = k.Transport(10 * time.Second)
	// No Writer.Topic: every message names its topic.
	p.w = &kafka.Writer{
		Addr:         kafka.TCP(cfg.Brokers...),
		Balancer:     partitionBalancer,
		BatchSize:    1000,
		BatchBytes:   int64(maxBytes) + 1<<20,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireAll, // TiCDC's default: WaitForAll
		MaxAttempts:  10,
		Transport:    p.transport,
	}
	return p, nil
}

// ensureTopic returns the partitions of topic, creating it with cfg.Partitions when it
// does not exist and cfg.Partitions > 0.
func ensureTopic(ctx context.Context, k *tlsauth.Kafka, cfg *Config, topic string) (int, error) {
	n, err := topicPartitions(ctx, k, cfg.Brokers, topic)
	if errors.Is(err, kafka.UnknownTopicOrPartition) && cfg.Partitions > 0 {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = createTopic(cctx, k, cfg.Brokers, topic, cfg.Partitions)
		cancel()
		if err == nil {
			n, err = topicPartitions(ctx, k, cfg.Brokers, topic)
		}
	}
	return n, err
}

// table returns the definition of a table for canal-json and simple.
func (p *producer) table(schema, table string) (*wireTable, error) {
	t := p.tables[schema+"."+table]
	if t == nil {
		return nil, fmt.Errorf("table %s.%s has no loaded definition", schema, table)
	}
	return t, nil
}

// Close flushes the writer and closes its connections (a Writer does not close the idle
// connections of a Transport it was given).
func (p *producer) Close() error {
	err := p.w.Close()
	p.transport.CloseIdleConnections()
	return err
}

// group is the records of one (topic, partition, partition key) in one round.
type group struct {
	topic     string
	partition int
	enc       rowBatch
}

// publishTxns encodes transactions (in commit-ts order) and writes them, returning once
// Kafka acknowledged every record. Like TiCDC's MQ worker it batches only events with the
// same topic, partition and partition key into one record.
func (p *producer) publishTxns(ctx context.Context, txns []*txn) (records, rows int, err error) {
	if len(txns) == 0 {
		return 0, 0, nil
	}
	if err := p.bootstrap(ctx, txns); err != nil {
		return 0, 0, err
	}
	groups := map[string]*group{}
	var order []*group
	for _, t := range txns {
		for _, ev := range t.events {
			top, err := p.topicOf(ev.Schema)
			if err != nil {
				return 0, 0, fmt.Errorf("%s.%s row at ts %d: %w", ev.Schema, ev.Table, ev.CommitTs, err)
			}
			part, key := p.dispatcher.Dispatch(ev, top.partitions)
			gk := fmt.Sprintf("%s/%d/%s", top.name, part, key)
			g := groups[gk]
			if g == nil {
				enc, err := p.wire.rowBatch()
				if err != nil {
					return 0, 0, err
				}
				g = &group{topic: top.name, partition: part, enc: enc}
				groups[gk] = g
				order = append(order, g)
			}
			if err := g.enc.AppendRow(ev); err != nil {
				return 0, 0, fmt.Errorf("encode %s.%s row at ts %d: %w", ev.Schema, ev.Table, ev.CommitTs, err)
			}
			rows++
		}
	}
	var msgs []kafka.Message
	for _, g := range order {
		for _, m := range g.enc.Build() {
			msgs = append(msgs, kafka.Message{Topic: g.topic, Partition: g.partition, Key: m.Key, Value: m.Value})
		}
	}
	if err := p.write(ctx, msgs); err != nil {
		return 0, 0, fmt.Errorf("write %d records to %s: %w", len(msgs), p.topicNames(), err)
	}
	return len(msgs), rows, nil
}

// topicNames names the producer's topics for errors and logs.
func (p *producer) topicNames() string {
	names := make([]string, len(p.topics))
	for i, t := range p.topics {
		names[i] = t.name
	}
	if len(names) == 1 {
		return "topic " + names[0]
	}
	return "topics " + strings.Join(names, ",")
}

// bootstrap sends, for simple, a table's BOOTSTRAP to every partition of its topic before
// the table's first row and again every bootstrapInterval or bootstrapMessages rows, as
// TiCDC's bootstrap worker does (send-bootstrap-to-all-partition = true); Kafka has
// acknowledged them when it returns. Other protocols have none.
func (p *producer) bootstrap(ctx context.Context, txns []*txn) error {
	if w, ok := p.wire.(*jsonWire); !ok || !w.simple {
		return nil
	}
	due := map[string]bool{}
	for _, t := range txns {
		for _, ev := range t.events {
			top, err := p.topicOf(ev.Schema)
			if err != nil {
				return fmt.Errorf("%s.%s row at ts %d: %w", ev.Schema, ev.Table, ev.CommitTs, err)
			}
			k := top.name + "\x00" + ev.Schema + "." + ev.Table
			st := p.boot[k]
			if st == nil || time.Since(st.at) >= bootstrapInterval || st.rows >= bootstrapMessages {
				if !due[k] {
					due[k] = true
					wt, err := p.table(ev.Schema, ev.Table)
					if err != nil {
						return err
					}
					v, err := encodeSimpleBootstrap(wt)
					if err != nil {
						return fmt.Errorf("encode bootstrap of %s.%s: %w", ev.Schema, ev.Table, err)
					}
					if _, err := p.broadcast(ctx, open.Message{Value: v}, false, top); err != nil {
						return err
					}
					st = &bootState{at: time.Now()}
					p.boot[k] = st
				}
			}
			st.rows++
		}
	}
	return nil
}

// broadcast writes one record to every partition of the given topics (TiCDC's
// SyncBroadcastMessage), or with firstOnly to partition 0 of each, and returns the
// number of records written.
func (p *producer) broadcast(ctx context.Context, m open.Message, firstOnly bool, topics ...*outTopic) (int, error) {
	var msgs []kafka.Message
	var names []string
	for _, t := range topics {
		names = append(names, t.name)
		n := t.partitions
		if firstOnly {
			n = 1
		}
		for i := 0; i < n; i++ {
			msgs = append(msgs, kafka.Message{Topic: t.name, Partition: i, Key: m.Key, Value: m.Value})
		}
	}
	if err := p.write(ctx, msgs); err != nil {
		return 0, fmt.Errorf("broadcast to topic %s: %w", strings.Join(names, ","), err)
	}
	return len(msgs), nil
}

// write writes messages until Kafka acknowledges all of them, retrying failed writes
// (kafka-go retries only some errors itself, not e.g. a partition briefly without
// leader). A retry may write some records twice; TiCDC's delivery is at-least-once too.
func (p *producer) write(ctx context.Context, msgs []kafka.Message) error {
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := p.w.WriteMessages(ctx, msgs...)
		if err == nil || ctx.Err() != nil || attempt == 8 {
			return err
		}
		if p.log != nil {
			p.log.Warn("kafka write failed; retrying", "topic", p.topicNames(), "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// resolved broadcasts a resolved ts to every partition of every topic, as TiCDC sends
// its checkpoint to all of a changefeed's topics; it returns the records written.
func (p *producer) resolved(ctx context.Context, ts uint64) (int, error) {
	m, err := p.wire.resolved(ts)
	if err != nil {
		return 0, fmt.Errorf("encode resolved ts %d: %w", ts, err)
	}
	return p.broadcast(ctx, m, false, p.topics...)
}

// ddl sends a DDL to every partition of its schema's topic (canal-json: to partition 0
// only, as TiCDC does) and returns the records written. TiCDC sends a schema-level DDL (CREATE DATABASE) to the changefeed's
// default topic; loadgen has none and sends it to the schema's topic, so that each
// topic alone builds its schemas.
func (p *producer) ddl(ctx context.Context, ev *open.Event) (int, error) {
	m, err := p.wire.ddl(ev)
	if err != nil {
		return 0, fmt.Errorf("encode ddl %q: %w", ev.Query, err)
	}
	t, err := p.topicOf(ev.Schema)
	if err != nil {
		return 0, fmt.Errorf("ddl %q: %w", ev.Query, err)
	}
	return p.broadcast(ctx, m, !p.wire.ddlToAll(), t)
}

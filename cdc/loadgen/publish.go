package loadgen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
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

// producer writes open-protocol records to explicit partitions of one topic.
type producer struct {
	w          *kafka.Writer
	transport  *kafka.Transport
	log        *slog.Logger
	topic      string
	partitions int
	dispatcher Dispatcher
	encCfg     open.EncoderConfig
	enc        *open.Encoder // for DDL and resolved records
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

func newProducer(ctx context.Context, cfg *Config) (*producer, error) {
	k, err := tlsauth.NewKafka("kafka", cfg.KafkaTLS, cfg.KafkaSASL)
	if err != nil {
		return nil, err
	}
	n, err := topicPartitions(ctx, k, cfg.Brokers, cfg.Topic)
	if errors.Is(err, kafka.UnknownTopicOrPartition) && cfg.Partitions > 0 {
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = createTopic(cctx, k, cfg.Brokers, cfg.Topic, cfg.Partitions)
		cancel()
		if err == nil {
			n, err = topicPartitions(ctx, k, cfg.Brokers, cfg.Topic)
		}
	}
	if err != nil {
		return nil, err
	}
	d, err := NewDispatcher(cfg.Dispatcher)
	if err != nil {
		return nil, err
	}
	enc, err := open.NewEncoder(cfg.Encoder)
	if err != nil {
		return nil, err
	}
	maxBytes := cfg.Encoder.MaxMessageBytes
	if maxBytes == 0 {
		maxBytes = open.DefaultEncoderConfig().MaxMessageBytes
	}
	transport := k.Transport(10 * time.Second)
	w := &kafka.Writer{
		Addr:         kafka.TCP(cfg.Brokers...),
		Topic:        cfg.Topic,
		Balancer:     partitionBalancer,
		BatchSize:    1000,
		BatchBytes:   int64(maxBytes) + 1<<20,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireAll, // TiCDC's default: WaitForAll
		MaxAttempts:  10,
		Transport:    transport,
	}
	return &producer{w: w, transport: transport, log: cfg.Logger, topic: cfg.Topic, partitions: n, dispatcher: d, encCfg: cfg.Encoder, enc: enc}, nil
}

// Close flushes the writer and closes its connections (a Writer does not close the idle
// connections of a Transport it was given).
func (p *producer) Close() error {
	err := p.w.Close()
	p.transport.CloseIdleConnections()
	return err
}

// group is the records of one (partition, partition key) in one round.
type group struct {
	partition int
	enc       *open.Encoder
}

// publishTxns encodes transactions (in commit-ts order) and writes them, returning once
// Kafka acknowledged every record. Like TiCDC's MQ worker it batches only events with the
// same partition and partition key into one record.
func (p *producer) publishTxns(ctx context.Context, txns []*txn) (records, rows int, err error) {
	if len(txns) == 0 {
		return 0, 0, nil
	}
	groups := map[string]*group{}
	var order []*group
	for _, t := range txns {
		for _, ev := range t.events {
			part, key := p.dispatcher.Dispatch(ev, p.partitions)
			gk := fmt.Sprintf("%d/%s", part, key)
			g := groups[gk]
			if g == nil {
				enc, err := open.NewEncoder(p.encCfg)
				if err != nil {
					return 0, 0, err
				}
				g = &group{partition: part, enc: enc}
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
			msgs = append(msgs, kafka.Message{Partition: g.partition, Key: m.Key, Value: m.Value})
		}
	}
	if err := p.write(ctx, msgs); err != nil {
		return 0, 0, fmt.Errorf("write %d records to topic %s: %w", len(msgs), p.topic, err)
	}
	return len(msgs), rows, nil
}

// broadcast writes one record to every partition (TiCDC's SyncBroadcastMessage).
func (p *producer) broadcast(ctx context.Context, m open.Message) error {
	msgs := make([]kafka.Message, p.partitions)
	for i := range msgs {
		msgs[i] = kafka.Message{Partition: i, Key: m.Key, Value: m.Value}
	}
	if err := p.write(ctx, msgs); err != nil {
		return fmt.Errorf("broadcast to topic %s: %w", p.topic, err)
	}
	return nil
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
			p.log.Warn("kafka write failed; retrying", "topic", p.topic, "attempt", attempt, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (p *producer) resolved(ctx context.Context, ts uint64) error {
	return p.broadcast(ctx, p.enc.EncodeResolved(ts))
}

func (p *producer) ddl(ctx context.Context, ev *open.Event) error {
	m, err := p.enc.EncodeDDL(ev)
	if err != nil {
		return fmt.Errorf("encode ddl %q: %w", ev.Query, err)
	}
	return p.broadcast(ctx, m)
}

package cdc

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/internal/tlsauth"
)

// partitionWatch lists the partitions of the changefeed's topics with a fresh metadata
// request each time (kafka-go's Transport would answer from a cache refreshed every few
// seconds), over one connection kept between listings.
type partitionWatch struct {
	cf    ChangefeedConfig
	kafka *tlsauth.Kafka
	re    *regexp.Regexp
	conn  *kafka.Conn
}

func newPartitionWatch(cf ChangefeedConfig, k *tlsauth.Kafka) *partitionWatch {
	w := &partitionWatch{cf: cf, kafka: k}
	if cf.TopicRegex != "" {
		w.re = regexp.MustCompile("^(?:" + cf.TopicRegex + ")$")
	}
	return w
}

func (w *partitionWatch) close() {
	if w.conn != nil {
		_ = w.conn.Close()
		w.conn = nil
	}
}

// list returns every partition of the changefeed's topics (topics, or those matching
// topic-regex), sorted.
func (w *partitionWatch) list(ctx context.Context) ([]partKey, error) {
	var parts []kafka.Partition
	var lastErr error
	for attempt := 0; attempt <= len(w.cf.Brokers); attempt++ {
		if w.conn == nil {
			b := w.cf.Brokers[attempt%len(w.cf.Brokers)]
			conn, err := w.kafka.Dialer(10*time.Second).DialContext(ctx, "tcp", b)
			if err != nil {
				lastErr = err
				continue
			}
			w.conn = conn
		}
		if dl, ok := ctx.Deadline(); ok {
			_ = w.conn.SetDeadline(dl)
		} else {
			_ = w.conn.SetDeadline(time.Now().Add(10 * time.Second))
		}
		var err error
		if w.re != nil {
			parts, err = w.conn.ReadPartitions()
		} else {
			parts, err = w.conn.ReadPartitions(w.cf.Topics...)
		}
		if err == nil {
			lastErr = nil
			break
		}
		lastErr = err
		w.close()
	}
	if errors.Is(lastErr, kafka.UnknownTopicOrPartition) {
		// Kafka answered: a configured topic does not exist (any more).
		return nil, fmt.Errorf("listing partitions of topics %v: %w: %w", w.cf.Topics, lastErr, errNoPartitions)
	}
	if lastErr != nil {
		return nil, fmt.Errorf("listing changefeed partitions: %w", w.kafka.Explain(lastErr))
	}
	var out []partKey
	seen := map[string]bool{}
	for _, p := range parts {
		if w.re != nil && !w.re.MatchString(p.Topic) {
			continue
		}
		seen[p.Topic] = true
		out = append(out, partKey{p.Topic, p.ID})
	}
	for _, t := range w.cf.Topics {
		if !seen[t] {
			return nil, fmt.Errorf("topic %s has no partitions (does it exist?): %w", t, errNoPartitions)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no topic matches changefeed.topic-regex %q: %w", w.cf.TopicRegex, errNoPartitions)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Topic != out[j].Topic {
			return out[i].Topic < out[j].Topic
		}
		return out[i].Partition < out[j].Partition
	})
	return out, nil
}

// idleCheckInterval: while no round runs, the partitions are checked this often.
const idleCheckInterval = 10 * time.Second

// errNoPartitions: Kafka answered, and a configured topic (or every topic-regex match) has
// no partitions.
var errNoPartitions = errors.New("no partitions")

// partitionsChanged ends a run whose topics gained or lost partitions (or, with
// topic-regex, topics): Run starts over on the new list.
type partitionsChanged struct {
	added, removed []string
}

func (e *partitionsChanged) Error() string {
	return fmt.Sprintf("the changefeed's partitions changed: added %v, removed %v", e.added, e.removed)
}

// checkPartitions is called before every round. A round applies up to a resolved ts T
// received on the partitions being read; TiCDC emits T only after every row with commit
// ts <= T is written, so a partition (or a topic-regex topic) TiCDC writes rows to existed
// before T arrived, and a listing made now includes it. Were it missed, its rows up to T
// would never be applied: the checkpoint would pass them. So a changed list ends the run
// (*partitionsChanged) before anything is applied, and the replicator starts over reading
// the new list (a new partition from its first offset). ok is false when the partitions
// could not be listed: the round waits. It also runs every idleCheckInterval while no
// round does, so a deleted topic (after which no resolved ts comes) stops the replicator
// with an error naming it instead of leaving it waiting.
func (c *coordinator) checkPartitions(ctx context.Context) (ok bool, err error) {
	if c.watch == nil {
		return true, nil
	}
	c.lastCheck = time.Now()
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	now, err := c.watch.list(lctx)
	if errors.Is(err, errNoPartitions) {
		// A topic went away: nothing to wait for.
		return false, fmt.Errorf("before applying up to the resolved ts: %w", err)
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, nil
		}
		if time.Since(c.lastListErr) > 10*time.Second {
			c.lastListErr = time.Now()
			c.log.Warn("cannot list the changefeed's partitions; applying waits until it can", "err", err)
		}
		return false, nil
	}
	// Both lists are sorted (c.parts follows the list the run started from): the usual
	// case, nothing changed, costs one pass.
	if slices.EqualFunc(now, c.parts, func(k partKey, p *partState) bool { return k == p.key }) {
		return true, nil
	}
	known := make(map[partKey]bool, len(c.parts))
	for _, p := range c.parts {
		known[p.key] = true
	}
	var added, removed []string
	for _, k := range now {
		if !known[k] {
			added = append(added, k.String())
		}
		delete(known, k)
	}
	for _, p := range c.parts {
		if known[p.key] {
			removed = append(removed, p.key.String())
		}
	}
	if len(added) > 0 || len(removed) > 0 {
		return false, &partitionsChanged{added: added, removed: removed}
	}
	return true, nil
}

package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidb-parity/parity/internal/testenv"
)

// TestCorpusReplay is issue 21's end-to-end truth test: the Kafka records of
// ../shared/ticdc-corpus — bytes made by TiCDC's own encoders, not by parity — are produced
// unchanged to a fresh topic, composed into the sequences a changefeed would have sent
// (DDL first, rows in commit-ts order, resolved events after), and `parity serve` applies
// them with several workers and two-row batches. Every row and column of every resulting
// table is then compared with a state computed here, independently of parity's decoder,
// from the events each case's expected.json says the encoder was given
// (rowModel: inserts and updates set a row, deletes remove it, DDL create, truncate,
// drop and rename tables).
//
// Classic (tiflow) and new-architecture (pingcap/ticdc) records go through separate
// changefeeds: their commit ts overlap. Each story has variants using the corpus's
// alternative encodings of one change (full delete, handle-key-only delete,
// claim-check insert, update with only the updated columns or without the old value);
// the compression cases run in changefeeds configured for their compression; and one run
// maps both stories with changefeed.schema-map into their own schemas, side by side.
//
// The insert of id=5 followed, in the same round, by its delete carrying only the handle
// key (row-all-types-05 then -12, large-05 then large-03, and the newarch pair) is the
// case of issue 21's routing race; after the story it is repeated for many rounds (keys
// re-stamped with new commit ts, values unchanged; large-05 is not repeated, as its
// claim-check object holds its commit ts), serve restarted now and then, and the row
// must be gone after every round. PARITY_CORPUS_ROUNDS sets the number of rounds.
// Before the routing fix (0d2dbf4, VECTOR mapped by hand) the first round left id=5 on
// the fallback; before the DDL translation fix (957bc41) every story stopped at the
// VECTOR CREATE TABLE, and the schema-map run at "Unknown database".
//
// Left out, on purpose:
//   - large-01 and large-02 (handle-key-only INSERT and UPDATE): serve completes them by
//     reading TiDB at their commit ts (upstream.dsn), and no TiDB here holds the corpus's
//     rows at its 2026 commit ts; handle-key-only DELETEs need nothing and are in.
//   - resolved-03 (resolved ts 0, 2^63 and 2^64-1): edge values for a decoder, not what a
//     changefeed sends (2^63 would mark every later event as already resolved), and the
//     third record of newarch-resolved-01 (2^64-1) for the same reason.
func TestCorpusReplay(t *testing.T) {
	cs := loadReplayCorpus(t)
	rounds := replayEnvInt(t, "PARITY_CORPUS_ROUNDS", 30)

	// Without schema-map the stories replicate into the schemas the records name, one
	// run after the other.
	for _, v := range []struct {
		name       string
		story      func() *replayStory
		claimCheck string
		rounds     int
	}{
		{"classic", func() *replayStory { return cs.classicStory(classicVariant1) }, "", rounds},
		{"classic-claim-check", func() *replayStory { return cs.classicStory(classicVariant2) }, "large-05-claim-check-insert", rounds / 3},
	} {
		t.Run(v.name, func(t *testing.T) {
			r := cs.newRun(t, nil)
			r.precreate("corpus_tmp")
			r.changefeed(v.story(), "none", v.claimCheck)
			r.compare()
			if v.rounds > 0 {
				r.raceRounds(v.rounds, classicRaceCycles)
			}
			r.stop()
		})
	}
	for _, comp := range []string{"snappy", "lz4"} {
		t.Run("classic-"+comp, func(t *testing.T) {
			r := cs.newRun(t, nil)
			r.changefeed(cs.classicCompressionSetup(), "none", "")
			r.stop()
			r.changefeed(cs.classicCompressionStory(comp), comp, "")
			r.compare()
			r.stop()
		})
	}
	for _, v := range []struct {
		name       string
		variant    newarchVariant
		claimCheck string
		rounds     int
	}{
		{"newarch", newarchVariant1, "", rounds},
		{"newarch-claim-check", newarchVariant2, "newarch-large-05-claim-check-insert", 0},
	} {
		t.Run(v.name, func(t *testing.T) {
			r := cs.newRun(t, nil)
			r.changefeed(cs.newarchSetup(), "none", "")
			r.stop()
			r.changefeed(cs.newarchStory(v.variant), "none", v.claimCheck)
			r.compare()
			if v.rounds > 0 {
				r.raceRounds(v.rounds, newarchRaceCycles)
			}
			r.stop()
		})
	}
	for _, comp := range []string{"snappy", "lz4"} {
		t.Run("newarch-"+comp, func(t *testing.T) {
			r := cs.newRun(t, nil)
			r.changefeed(cs.newarchCompressionSetup(), "none", "")
			r.stop()
			r.changefeed(cs.newarchCompressionStory(comp), comp, "")
			r.compare()
			r.stop()
		})
	}
	// Both stories at once, each mapped into schemas of its own.
	t.Run("schema-map", func(t *testing.T) {
		t.Run("classic", func(t *testing.T) {
			t.Parallel()
			r := cs.newRun(t, map[string]string{"corpus": testenv.UniqueName("corpus_c"), "corpus_tmp": testenv.UniqueName("corpus_tmp_c")})
			r.precreate("corpus_tmp")
			r.changefeed(cs.classicStory(classicVariant3), "none", "")
			r.compare()
			r.stop()
		})
		t.Run("newarch", func(t *testing.T) {
			t.Parallel()
			r := cs.newRun(t, map[string]string{"corpus": testenv.UniqueName("corpus_n")})
			r.changefeed(cs.newarchSetup(), "none", "")
			r.stop()
			r.changefeed(cs.newarchStory(newarchVariant3), "none", "")
			r.compare()
			r.stop()
		})
	})
}

// replayEnvInt reads a positive integer from the environment, def when unset.
func replayEnvInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, v)
	}
	return n
}

// ---- a run: changefeeds replayed one after the other into one downstream ----

type corpusRun struct {
	t         *testing.T
	c         *replayCorpus
	schemaMap map[string]string // upstream schema → downstream; nil: the same names
	model     *rowModel
	e         *env
	s         *serve
	story     *replayStory // the current changefeed's
	workers   int
}

// newRun starts from a downstream without the stories' schemas (dropped first when they
// are the records' own names).
func (c *replayCorpus) newRun(t *testing.T, schemaMap map[string]string) *corpusRun {
	r := &corpusRun{t: t, c: c, schemaMap: schemaMap, model: newRowModel(), workers: 6}
	down := openFallback(t, "+08:00")
	for _, s := range []string{"corpus", "corpus_tmp"} {
		d := r.target(s)
		if _, err := down.Exec("DROP DATABASE IF EXISTS " + replayQuote(d)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if os.Getenv("PARITY_TEST_KEEP") != "1" {
				_, _ = down.Exec("DROP DATABASE IF EXISTS " + replayQuote(d))
			}
		})
	}
	return r
}

// precreate creates a schema downstream that the story's changefeed found there:
// corpus_tmp, which ddl-16 drops, was created before the corpus's window.
func (r *corpusRun) precreate(schema string) {
	r.t.Helper()
	down := openFallback(r.t, "+08:00")
	if _, err := down.Exec("CREATE DATABASE " + replayQuote(r.target(schema))); err != nil {
		r.t.Fatal(err)
	}
	r.model.schemas[schema] = true
}

func (r *corpusRun) target(schema string) string {
	if d, ok := r.schemaMap[schema]; ok {
		return d
	}
	return schema
}

// changefeed replays a story through a fresh topic into a fresh changefeed and waits
// until serve applied its last resolved ts.
func (r *corpusRun) changefeed(s *replayStory, compression, claimCheckCase string) {
	r.t.Helper()
	r.e = newReplayEnv(r.t, 3, "+08:00") // TiCDC rendered TIMESTAMPs in Asia/Shanghai
	r.story = s
	r.writeConfig(compression, claimCheckCase)
	produce(r.t, r.e, s.messages(r.e.partitions))
	for _, rec := range s.recs {
		r.model.apply(r.t, rec)
	}
	r.s = r.e.startServe()
	r.e.waitApplied(r.s, s.resolved, 2*time.Minute)
}

func (r *corpusRun) writeConfig(compression, claimCheckCase string) {
	cf := fmt.Sprintf("compression = %q\n", compression)
	if claimCheckCase != "" {
		cf += fmt.Sprintf("claim-check-dir = %q\n", filepath.Join(r.c.get(claimCheckCase).Dir, "claim-check"))
	}
	if len(r.schemaMap) > 0 {
		var kv []string
		for k, v := range r.schemaMap {
			kv = append(kv, fmt.Sprintf("%s = %q", k, v))
		}
		cf += "schema-map = { " + strings.Join(kv, ", ") + " }\n"
	}
	r.e.writeConfig(cf, fmt.Sprintf("workers = %d\nbatch-rows = 2\n", r.workers))
}

func (r *corpusRun) stop() {
	if r.s != nil {
		r.s.stop(r.t)
		r.s = nil
	}
}

// compare checks the downstream against the model: every schema, table, row and column.
func (r *corpusRun) compare() {
	r.t.Helper()
	down := openFallback(r.t, "+08:00")
	if errs := r.model.compare(r.t, down, r.target, ""); len(errs) > 0 {
		for _, e := range errs {
			r.t.Error(e)
		}
		r.t.Fatalf("the fallback differs from the corpus's events in %d places; log of the last serve:\n%s", len(errs), r.e.serveLog())
	}
	r.t.Logf("the fallback equals the corpus's events: %s", r.model.summary())
}

// raceRounds repeats, round after round, inserts of id=5 each followed in the same round
// by a delete of it (cycles), and checks after every round that the table equals the
// model — in particular that id=5 is gone. Serve restarts every 10 rounds.
func (r *corpusRun) raceRounds(rounds int, cycles [][2]string) {
	r.t.Helper()
	down := openFallback(r.t, "+08:00")
	ts := r.story.resolved
	for round := range rounds {
		if round > 0 && round%10 == 0 {
			r.s.stop(r.t)
			r.s = r.e.startServe()
		}
		s := r.c.story(r.story.newarch)
		s.resolved, s.last = r.story.resolved, r.story.last
		var desc []string
		for _, cy := range cycles {
			ts += 1 << 18 // one millisecond of TSO
			s.again(cy[0], ts)
			ts += 1 << 18
			s.again(cy[1], ts)
			desc = append(desc, fmt.Sprintf("%s then %s", cy[0], cy[1]))
		}
		s.resolvedAt(ts)
		r.story = s
		produce(r.t, r.e, s.messages(r.e.partitions))
		for _, rec := range s.recs {
			r.model.apply(r.t, rec)
		}
		r.e.waitApplied(r.s, ts, time.Minute)
		if errs := r.model.compare(r.t, down, r.target, "corpus.all_types"); len(errs) > 0 {
			for _, e := range errs {
				r.t.Error(e)
			}
			r.t.Fatalf("round %d of %d (%s, resolved ts %d, %d workers): the fallback differs from the events",
				round+1, rounds, strings.Join(desc, "; "), ts, r.workers)
		}
	}
	r.compare()
	r.t.Logf("%d rounds of insert + delete of one key in one round: the key was gone after each", rounds)
}

// produce writes records to their partitions of the env's topic, in order. The writer
// has a transport of its own: kafka-go's shared one keeps topic metadata for seconds and
// would not know a topic created just before.
func produce(t *testing.T, e *env, msgs []kafka.Message) {
	t.Helper()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr:         kafka.TCP(e.broker),
		Topic:        e.topic,
		Balancer:     kafka.BalancerFunc(func(m kafka.Message, _ ...int) int { return m.Partition }),
		BatchSize:    1000,
		BatchBytes:   32 << 20,
		BatchTimeout: time.Millisecond,
		RequiredAcks: kafka.RequireAll,
		Transport:    tr,
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := writeRetry(ctx, w, msgs); err != nil {
		t.Fatalf("produce %d records to %s: %v", len(msgs), e.topic, err)
	}
}

// replayQuote quotes an identifier for MySQL (the tests' own, independent of parity's).
func replayQuote(s string) string { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }

// replayBase64 decodes expected.json's base64 values.
func replayBase64(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }

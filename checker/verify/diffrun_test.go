package verify

import (
	"errors"
	"testing"

	"github.com/tidb-parity/parity/checker"
)

// TestDifferencesOfADiffRun: a `parity diff` run kept in the daemon's meta schema is read
// through Differences too (what repair takes), its tables filtered as a verification
// run's, a table it did not compare is an invalid request naming it, and a run that is
// neither is ErrRunNotFound.
func TestDifferencesOfADiffRun(t *testing.T) {
	f := newFixture(t, 200)
	f.exec(t, f.down, "UPDATE "+f.db+".t1 SET v = 'changed' WHERE id = 17")
	f.exec(t, f.down, "DELETE FROM "+f.db+".t1 WHERE id = 90")
	s, err := New(f.config(), Deps{Applier: &stillApplier{ts: f.ts}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	serve(t, s)
	ctx := ctxMinute(t)

	cfg := checker.DefaultConfig()
	cfg.Upstream.DSN, cfg.Downstream.DSN, cfg.MetaSchema = f.upDSN, f.downDSN, f.meta
	cfg.Tables = []string{f.db + ".t1"}
	rep, err := checker.NewDiff(cfg, nil).Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.RunID == "" {
		t.Fatal("the diff run has no id")
	}
	ds, err := s.Differences(ctx, rep.RunID, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]checker.DiffKind{}
	for _, d := range ds {
		if d.RunID != rep.RunID || d.UpTable != "t1" {
			t.Errorf("difference of another run or table: %+v", d)
		}
		got[d.Key] = d.Kind
	}
	if len(got) != 2 || got["id=17"] != checker.Differing || got["id=90"] != checker.Missing {
		t.Fatalf("differences of diff run %s: %v, want id=17 differing and id=90 missing", rep.RunID, got)
	}
	if ds, err := s.Differences(ctx, rep.RunID, []string{f.db + ".t1"}); err != nil || len(ds) != 2 {
		t.Fatalf("differences of t1: %d, %v", len(ds), err)
	}

	_, err = s.Differences(ctx, rep.RunID, []string{f.db + ".nope"})
	var re *RequestError
	if !errors.Is(err, ErrInvalidRequest) || !errors.As(err, &re) || re.Field != FieldTables {
		t.Fatalf("a table the diff run did not compare: %v, want an invalid %s", err, FieldTables)
	}
	if _, err := s.Differences(ctx, "d20000101T000000-00000000", nil); !errors.Is(err, ErrRunNotFound) {
		t.Fatalf("an unknown run: %v, want ErrRunNotFound", err)
	}
}

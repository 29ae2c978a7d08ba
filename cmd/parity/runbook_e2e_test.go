package main

// The runbook's end-to-end tests (deploy/runbook.md, "Cutover"; #18's first "done when"):
// its steps against a live `parity serve` with the API, real Kafka, TiDB and MariaDB,
// while `parity loadgen` writes, once through the parity CLI and once through grpcurl
// (built from the Go module proxy by scripts/grpcurl.sh) using server reflection.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tidb-parity/parity/api/client"
	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/cdc/loadgen"
	"github.com/tidb-parity/parity/daemon"
	"github.com/tidb-parity/parity/internal/ident"
	"github.com/tidb-parity/parity/internal/testenv"
	"github.com/tidb-parity/parity/internal/tso"
)

// runbookEnv is a daemon replicating a loadgen database into the fallback, with
// verification of its tables and the API on a free loopback port behind a token (role
// repair, which may call everything).
type runbookEnv struct {
	ctx       context.Context
	upDSN     string
	broker    string
	topic     string
	up        *sql.DB
	down      *testenv.DB
	db        string
	load      *testLoad
	cfg       daemon.Config
	apiAddr   string
	token     string
	tokenFile string // the client's: the token alone
	client    parityv1.ParityClient
}

// startRunbookEnv starts the load and the daemon and waits until it has caught up.
func startRunbookEnv(t *testing.T, ctx context.Context, name string, withLoad bool) *runbookEnv {
	t.Helper()
	upDSN := testenv.Require(t, testenv.EnvUpstream)
	down := testenv.Downstream(t)
	broker := testenv.Kafka(t)
	topic := testenv.NewTopic(t, name, 3)
	db := testenv.UniqueName(name)
	e := &runbookEnv{ctx: ctx, upDSN: upDSN, broker: broker, topic: topic, down: down, db: db}
	var err error
	if e.up, err = sql.Open("mysql", upDSN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.up.Close() })

	var importTs uint64
	if withLoad {
		e.load = startLoad(t, ctx, upDSN, down.Root, broker, topic, db, func(lg *loadgen.Config) {
			lg.Tables, lg.Workers, lg.ImportRows = 2, 4, 2000
			lg.AllTypes, lg.Keyless = false, false
			lg.Rate, lg.RowsPerTxn = 150, 10
		})
		importTs = e.load.ImportTs
	}
	e.cfg = verifyServeConfig(t, name, upDSN, down, broker, topic, db, importTs)
	if !withLoad {
		e.cfg.Verify.Enabled, e.cfg.Verify.Tables = false, nil
	}
	e.apiAddr = freeAddr(t)
	e.cfg.API.Addr = e.apiAddr
	dir := t.TempDir()
	e.token = "runbook-" + testenv.UniqueName("tok") + "-0123456789abcdef"
	serverTokens := filepath.Join(dir, "tokens.toml")
	if err := os.WriteFile(serverTokens, []byte(fmt.Sprintf("[[token]]\nname = \"runbook\"\nrole = \"repair\"\ntoken = %q\n", e.token)), 0o600); err != nil {
		t.Fatal(err)
	}
	e.cfg.API.TokenFile = serverTokens
	e.tokenFile = filepath.Join(dir, "token")
	if err := os.WriteFile(e.tokenFile, []byte(e.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	runServeInTest(t, ctx, e.cfg)

	conn, err := grpc.NewClient(e.apiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(client.Bearer{Token: e.token}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	e.client = parityv1.NewParityClient(conn)
	deadline := time.Now().Add(90 * time.Second)
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		st, err := e.client.GetStatus(c, &parityv1.GetStatusRequest{})
		cancel()
		if err == nil && st.GetApplierState() == parityv1.ApplierState_APPLIER_STATE_RUNNING &&
			(!withLoad || st.GetAppliedTs() > importTs && st.GetAppliedLagSeconds() < 3) {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not catch up within 90s: %v %v", st, err)
		}
		if withLoad {
			if ended, err := e.load.Ended(); ended {
				t.Fatalf("loadgen ended early: %v", err)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stopWrites ends the workload on the migrated database (its last transactions and
// final resolved ts published), then starts a trickle of writes to another database
// through the same changefeed: loadgen stands in for TiCDC, which keeps resolving TSOs
// while TiDB is idle; without it nothing would resolve a TSO after the workload's last,
// and no wait for TiDB's current TSO could end.
func (e *runbookEnv) stopWrites(t *testing.T) {
	t.Helper()
	if _, err := e.load.Stop(); err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	startLoad(t, e.ctx, e.upDSN, e.down.Root, e.broker, e.topic, e.db+"_ticks", func(lg *loadgen.Config) {
		lg.Tables, lg.Workers, lg.ImportRows = 1, 1, 0
		lg.AllTypes, lg.Keyless = false, false
		lg.Rate, lg.RowsPerTxn = 2, 1
	})
}

// deletedSince waits for a key of db.sbtest1 that existed upstream at ts and has been
// deleted (or moved) since: loadgen never writes it again (it updates and deletes only
// ids it reads back), so a copy injected into the fallback stays a difference, and the
// changefeed changed it after ts, so a check of the keys changed since ts compares it.
// It returns the id and the row (k, c, pad) as it was at ts.
func (e *runbookEnv) deletedSince(t *testing.T, ts uint64) (int64, []any) {
	t.Helper()
	table := ident.Table(e.db, "sbtest1")
	deadline := time.Now().Add(60 * time.Second)
	for {
		atTS := map[int64][]any{}
		func() {
			conn, err := e.up.Conn(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			release, err := tso.At(e.ctx, conn, ts)
			if err != nil {
				t.Fatal(err)
			}
			defer release()
			rows, err := conn.QueryContext(e.ctx, "SELECT id, k, c, pad FROM "+table)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var id, k int64
				var c, pad string
				if err := rows.Scan(&id, &k, &c, &pad); err != nil {
					t.Fatal(err)
				}
				atTS[id] = []any{k, c, pad}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
		}()
		rows, err := e.up.QueryContext(e.ctx, "SELECT id FROM "+table)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			delete(atTS, id)
		}
		rows.Close()
		if len(atTS) > 0 {
			ids := slices.Sorted(func(yield func(int64) bool) {
				for id := range atTS {
					if !yield(id) {
						return
					}
				}
			})
			return ids[0], atTS[ids[0]]
		}
		if time.Now().After(deadline) {
			t.Fatalf("loadgen deleted no row of %s within 60s after TSO %d", table, ts)
		}
		time.Sleep(time.Second)
	}
}

// inject writes the row of a key TiDB no longer has into the fallback: an extra row.
func (e *runbookEnv) inject(t *testing.T, id int64, row []any) {
	t.Helper()
	if _, err := e.down.ExecContext(e.ctx, "INSERT INTO "+ident.Table(e.db, "sbtest1")+" (id, k, c, pad) VALUES (?, ?, ?, ?)",
		append([]any{id}, row...)...); err != nil {
		t.Fatal(err)
	}
}

// fallbackHas reports whether the fallback holds the key.
func (e *runbookEnv) fallbackHas(t *testing.T, id int64) bool {
	t.Helper()
	var n int
	if err := e.down.QueryRowContext(e.ctx, "SELECT COUNT(*) FROM "+ident.Table(e.db, "sbtest1")+" WHERE id = ?", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}

// cliJSON runs a CLI command with --json and decodes its answer into m.
func cliJSON(t *testing.T, m proto.Message, wantCode int, args ...string) {
	t.Helper()
	code, out, errs := runCLI(t, append(args, "--json")...)
	if code != wantCode {
		t.Fatalf("parity %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, wantCode, out, errs)
	}
	if err := (protojson.UnmarshalOptions{}).Unmarshal([]byte(out), m); err != nil {
		t.Fatalf("parity %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// cli runs a CLI command for its human output.
func cli(t *testing.T, wantCode int, args ...string) string {
	t.Helper()
	code, out, errs := runCLI(t, args...)
	if code != wantCode {
		t.Fatalf("parity %s: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, wantCode, out, errs)
	}
	t.Logf("parity %s (exit %d):\n%s", strings.Join(args, " "), code, out)
	return out
}

// checkCutoverFound checks a failed cutover check: the injected key is its one
// difference, extra, classified; its table failed, the other passed.
func checkCutoverFound(t *testing.T, e *runbookEnv, r *parityv1.CutoverCheckResponse, id int64) {
	t.Helper()
	if r.GetPassed() || len(r.GetFailures()) == 0 {
		t.Fatalf("cutover check passed with a divergence in the fallback: %v", r)
	}
	if len(r.GetDifferences()) != 1 {
		t.Fatalf("cutover check found %d differences, want the injected one: %v", len(r.GetDifferences()), r.GetDifferences())
	}
	d := r.GetDifferences()[0]
	t.Logf("the cutover check found %s %s %s, class %s, at pair %d (%s)", d.GetTable(), kindName(d.GetKind()), d.GetKey(), d.GetClass(),
		r.GetPair().GetTs(), r.GetPair().GetDownstreamPosition())
	if d.GetTable() != e.db+".sbtest1" || d.GetKind() != parityv1.DifferenceKind_DIFFERENCE_KIND_EXTRA || d.GetKey() != fmt.Sprintf("id=%d", id) {
		t.Errorf("difference %v, want %s.sbtest1 extra id=%d", d, e.db, id)
	}
	// Found at a snapshot pair, on a key the changefeed deleted during live replication
	// and that was then written straight into the fallback, which the bypass detector saw.
	if d.GetClass() != "bypass" {
		t.Errorf("difference class %q, want bypass (the injection bypassed parity)", d.GetClass())
	}
	if n := r.GetDifferencesByClass()[d.GetClass()]; n != 1 {
		t.Errorf("differences by class %v", r.GetDifferencesByClass())
	}
	if r.GetPair().GetTs() < r.GetUpstreamTs() || r.GetPair().GetDownstreamPosition() == "" || r.GetDiff() == "" || r.GetKeysVerified() == 0 {
		t.Errorf("evidence incomplete: pair %v, upstream ts %d, diff %q, keys %d", r.GetPair(), r.GetUpstreamTs(), r.GetDiff(), r.GetKeysVerified())
	}
	results := map[string]string{}
	for _, tb := range r.GetTables() {
		results[tb.GetTable()] = tb.GetResult()
		if tb.GetLastFullDiff() == "" {
			t.Errorf("table %s: no last full run named", tb.GetTable())
		}
	}
	if results[e.db+".sbtest1"] != "different" || results[e.db+".sbtest2"] != "equal" {
		t.Errorf("table results %v, want sbtest1 different and sbtest2 equal", results)
	}
}

// TestRunbookCLI drives deploy/runbook.md's cutover steps with the parity CLI.
func TestRunbookCLI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	e := startRunbookEnv(t, ctx, "runbook_cli", true)
	conn := []string{"--addr", e.apiAddr, "--token-file", e.tokenFile}
	with := func(args ...string) []string { return append(args, conn...) }

	// Catch-up: the daemon replicates, the applier runs.
	out := cli(t, 0, with("status")...)
	if !regexp.MustCompile(`applier:\s+running`).MatchString(out) || !strings.Contains(out, "verification freshness:") {
		t.Errorf("status:\n%s", out)
	}
	var st parityv1.Status
	cliJSON(t, &st, 0, with("status")...)
	if st.GetChangefeed() != e.cfg.Changefeed.ID || st.GetAppliedTs() <= e.load.ImportTs || !st.GetVerification().GetEnabled() {
		t.Errorf("status: %v", &st)
	}

	// Wait for the upstream's current TSO.
	var w parityv1.WaitForAppliedResponse
	cliJSON(t, &w, 0, with("wait-applied", "--now", "--timeout", "2m")...)
	if w.GetTargetTs() <= e.load.ImportTs || w.GetAppliedTs() < w.GetTargetTs() {
		t.Errorf("wait-applied --now: target %d, applied %d (import %d)", w.GetTargetTs(), w.GetAppliedTs(), e.load.ImportTs)
	}
	// An old TSO is applied already; one far ahead is not within the timeout: exit 1.
	out = cli(t, 0, with("wait-applied", "--ts", strconv.FormatUint(e.load.ImportTs, 10))...)
	if !regexp.MustCompile(`applied ts:\s+\d+ \(`).MatchString(out) {
		t.Errorf("wait-applied --ts:\n%s", out)
	}
	future := tso.FromTime(time.Now().Add(time.Hour))
	if code, _, errs := runCLI(t, with("wait-applied", "--ts", strconv.FormatUint(future, 10), "--timeout", "2s")...); code != 1 || !strings.Contains(errs, "DeadlineExceeded") {
		t.Errorf("wait-applied for a TSO an hour ahead: exit %d, stderr %q; want 1 and DeadlineExceeded", code, errs)
	}

	// A snapshot point.
	var sp parityv1.SnapshotPoint
	cliJSON(t, &sp, 0, with("snapshot")...)
	if sp.GetTs() <= e.load.ImportTs || sp.GetDownstreamPosition() == "" || sp.GetPositionSource() == "" || sp.GetPause() == nil {
		t.Errorf("snapshot: %v", &sp)
	}

	// Continuous verification's baseline: a full run under load, watched to the end.
	out = cli(t, 0, with("diff", "start", "--scope", "full", "--watch")...)
	if !regexp.MustCompile(`result:\s+equal`).MatchString(out) || !regexp.MustCompile(`diffs/\S+ (running|queued)`).MatchString(out) {
		t.Errorf("diff start --watch: want progress lines and an equal result:\n%s", out)
	}
	runID := regexp.MustCompile(`(?m)^run:\s+(\S+)`).FindStringSubmatch(out)
	if runID == nil {
		t.Fatalf("diff start --watch printed no run:\n%s", out)
	}
	var full parityv1.Diff
	cliJSON(t, &full, 0, with("diff", "get", runID[1])...)
	if full.GetResult() != parityv1.DiffResult_DIFF_RESULT_EQUAL || full.GetScope() != "full" || full.GetTablesCompared() != 2 || full.GetRowsChecked() < 4000 || full.GetFirstTs() == 0 {
		t.Fatalf("the full run: %v", &full)
	}
	var list parityv1.ListDiffsResponse
	cliJSON(t, &list, 0, with("diff", "list", "--trigger", "manual")...)
	if len(list.GetDiffs()) != 1 || list.GetDiffs()[0].GetRunId() != full.GetRunId() {
		t.Errorf("diff list --trigger manual: %v", list.GetDiffs())
	}

	// A divergence in the fallback, on a key the changefeed deleted after the full run.
	id, row := e.deletedSince(t, full.GetFirstTs())
	cli(t, 0, with("wait-applied", "--now", "--timeout", "2m")...) // the delete is in the fallback
	e.inject(t, id, row)

	// The cutover gate finds it (exit 1), classified.
	var cc parityv1.CutoverCheckResponse
	cliJSON(t, &cc, 1, with("cutover-check", "--now", "--timeout", "5m")...)
	checkCutoverFound(t, e, &cc, id)
	run := runIDOf(cc.GetDiff())
	out = cli(t, 0, with("diff", "differences", run)...)
	if !strings.Contains(out, fmt.Sprintf("id=%d", id)) || !strings.Contains(out, "1 of 1 differences") {
		t.Errorf("diff differences:\n%s", out)
	}
	out = cli(t, 0, with("diff", "fix-sql", run)...)
	if !strings.Contains(out, "DELETE FROM") || !strings.Contains(out, strconv.FormatInt(id, 10)) {
		t.Errorf("diff fix-sql: want the DELETE of id %d:\n%s", id, out)
	}

	// Repaired through the apply stream: a dry run says what it would do (exit 1), the
	// repair deletes the row and verifies again (exit 0).
	out = cli(t, 1, with("repair", run, "--dry-run")...)
	if !strings.Contains(out, "1 would be deleted") || !e.fallbackHas(t, id) {
		t.Errorf("repair --dry-run:\n%s", out)
	}
	var rep parityv1.RepairResponse
	cliJSON(t, &rep, 0, with("repair", run)...)
	if rep.GetDeleted() != 1 || len(rep.GetKeys()) != 1 || rep.GetKeys()[0].GetAction() != "delete" || rep.GetVerifyResult() != parityv1.DiffResult_DIFF_RESULT_EQUAL {
		t.Errorf("repair: %v", &rep)
	}
	if e.fallbackHas(t, id) {
		t.Errorf("the repair left id %d in the fallback", id)
	}

	// Stop writes; the quiescent point is applied and the gate passes.
	e.stopWrites(t)
	cliJSON(t, &w, 0, with("wait-applied", "--now", "--timeout", "2m")...)
	out = cli(t, 0, with("cutover-check", "--now", "--timeout", "5m")...)
	if !regexp.MustCompile(`cutover check:\s+PASSED`).MatchString(out) || !strings.Contains(out, e.db+".sbtest1") {
		t.Errorf("cutover-check after the workload stopped:\n%s", out)
	}

	// Errors: an unknown run is exit 2 with the code and reason; a wrong token too.
	if code, _, errs := runCLI(t, with("diff", "get", "v20000101T000000-00000000")...); code != 2 || !strings.Contains(errs, "NotFound DIFF_NOT_FOUND") {
		t.Errorf("diff get of an unknown run: exit %d, stderr %q", code, errs)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("not-the-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI(t, "status", "--addr", e.apiAddr, "--token-file", bad); code != 2 || !strings.Contains(errs, "Unauthenticated UNAUTHENTICATED") {
		t.Errorf("status with a wrong token: exit %d, stderr %q", code, errs)
	}
}

// grpcurlBin builds grpcurl (scripts/grpcurl.sh) once and returns its path.
func grpcurlBin(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "../../scripts/grpcurl.sh", "--path").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("scripts/grpcurl.sh: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("scripts/grpcurl.sh: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// grpcurlRunner runs grpcurl against the daemon (plaintext, with the token when set).
type grpcurlRunner struct {
	bin, addr, token string
}

// run runs grpcurl with opts, the address, then rest; it returns the exit code, stdout
// and stderr.
func (g grpcurlRunner) run(t *testing.T, ctx context.Context, opts []string, rest ...string) (int, string, string) {
	t.Helper()
	all := []string{"-plaintext", "-format-error", "-max-time", "300"}
	if g.token != "" {
		all = append(all, "-H", "authorization: Bearer "+g.token)
	}
	all = append(append(append(all, opts...), g.addr), rest...)
	cmd := exec.CommandContext(ctx, g.bin, all...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("grpcurl %v: %v", all, err)
		}
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

// call runs an RPC with a JSON request and decodes its answer (a stream's last message
// into m, every message returned raw).
func (g grpcurlRunner) call(t *testing.T, ctx context.Context, method, req string, m proto.Message) []json.RawMessage {
	t.Helper()
	code, out, errs := g.run(t, ctx, []string{"-d", req}, "parity.v1.Parity/"+method)
	if code != 0 {
		t.Fatalf("grpcurl %s %s: exit %d\n%s%s", method, req, code, out, errs)
	}
	var msgs []json.RawMessage
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("grpcurl %s: %v\n%s", method, err, out)
		}
		msgs = append(msgs, raw)
	}
	if len(msgs) == 0 {
		t.Fatalf("grpcurl %s: no answer\n%s", method, errs)
	}
	if m != nil {
		if err := protojson.Unmarshal(msgs[len(msgs)-1], m); err != nil {
			t.Fatalf("grpcurl %s: %v\n%s", method, err, out)
		}
	}
	return msgs
}

// grpcurlError reads -format-error's JSON (on stdout or stderr): the gRPC code and the
// ErrorInfo reason (grpcurl exits 64 + the code).
func grpcurlError(t *testing.T, out, errs string) (int, string) {
	t.Helper()
	if strings.TrimSpace(out) == "" {
		out = errs
	}
	var e struct {
		Code    int `json:"code"`
		Details []struct {
			Type   string `json:"@type"`
			Reason string `json:"reason"`
		} `json:"details"`
	}
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Errorf("grpcurl's error: %v\n%s", err, out)
		return 0, ""
	}
	for _, d := range e.Details {
		if d.Type == "type.googleapis.com/google.rpc.ErrorInfo" {
			return e.Code, d.Reason
		}
	}
	return e.Code, ""
}

// TestGrpcurlReflection: grpcurl lists the service and health by reflection, describes
// the API, and the health check says SERVING while the applier runs.
func TestGrpcurlReflection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := grpcurlBin(t)
	e := startRunbookEnv(t, ctx, "grpcurl_list", false)
	g := grpcurlRunner{bin: bin, addr: e.apiAddr}
	code, out, errs := g.run(t, ctx, nil, "list")
	if code != 0 {
		t.Fatalf("grpcurl list: exit %d\n%s", code, errs)
	}
	t.Logf("grpcurl list:\n%s", out)
	services := strings.Fields(out)
	for _, want := range []string{"parity.v1.Parity", "grpc.health.v1.Health"} {
		if !slices.Contains(services, want) {
			t.Errorf("grpcurl list: %q lacks %s", out, want)
		}
	}
	code, out, errs = g.run(t, ctx, nil, "describe", "parity.v1.Parity")
	if code != 0 {
		t.Fatalf("grpcurl describe: exit %d\n%s", code, errs)
	}
	for _, rpc := range []string{"GetStatus", "WatchStatus", "WaitForApplied", "CreateSnapshotPoint", "StartDiff", "GetDiff", "WatchDiff",
		"CancelDiff", "ListDiffs", "ListDifferences", "GetFixSQL", "Repair", "CutoverCheck"} {
		if !strings.Contains(out, "rpc "+rpc+" ") {
			t.Errorf("grpcurl describe parity.v1.Parity lacks rpc %s:\n%s", rpc, out)
		}
	}
	code, out, errs = g.run(t, ctx, nil, "describe", "parity.v1.CutoverCheckResponse")
	if code != 0 || !strings.Contains(out, "bool passed = 1;") {
		t.Errorf("grpcurl describe parity.v1.CutoverCheckResponse: exit %d\n%s%s", code, out, errs)
	}
	// Health follows the applier's state as the server polls it (every 500 ms): SERVING
	// once the applier runs, which may be a moment after the daemon started.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out, errs = g.run(t, ctx, []string{"-d", `{"service":"parity.v1.Parity"}`}, "grpc.health.v1.Health/Check")
		if code == 0 && strings.Contains(out, `"status": "SERVING"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("health check never SERVING in 30s: exit %d\n%s%s", code, out, errs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRunbookGrpcurl drives deploy/runbook.md's cutover steps with grpcurl.
func TestRunbookGrpcurl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	bin := grpcurlBin(t)
	e := startRunbookEnv(t, ctx, "runbook_grpcurl", true)
	g := grpcurlRunner{bin: bin, addr: e.apiAddr, token: e.token}

	code, out, errs := g.run(t, ctx, nil, "list")
	if code != 0 || !strings.Contains(out, "parity.v1.Parity") || !strings.Contains(out, "grpc.health.v1.Health") {
		t.Fatalf("grpcurl list: exit %d\n%s%s", code, out, errs)
	}
	// Without the token: UNAUTHENTICATED with its reason.
	code, out, errs = grpcurlRunner{bin: bin, addr: e.apiAddr}.run(t, ctx, []string{"-d", "{}"}, "parity.v1.Parity/GetStatus")
	if c, reason := grpcurlError(t, out, errs); code != 64+16 || c != 16 || reason != "UNAUTHENTICATED" {
		t.Errorf("GetStatus without a token: exit %d, want 80 (Unauthenticated)\n%s%s", code, out, errs)
	}

	var st parityv1.Status
	g.call(t, ctx, "GetStatus", "{}", &st)
	if st.GetApplierState() != parityv1.ApplierState_APPLIER_STATE_RUNNING || st.GetAppliedTs() <= e.load.ImportTs {
		t.Errorf("GetStatus: %v", &st)
	}
	var w parityv1.WaitForAppliedResponse
	g.call(t, ctx, "WaitForApplied", `{"now": true, "timeout": "120s"}`, &w)
	if w.GetTargetTs() <= e.load.ImportTs || w.GetAppliedTs() < w.GetTargetTs() {
		t.Errorf("WaitForApplied now: %v", &w)
	}
	var sp parityv1.SnapshotPoint
	g.call(t, ctx, "CreateSnapshotPoint", "{}", &sp)
	if sp.GetTs() <= e.load.ImportTs || sp.GetDownstreamPosition() == "" {
		t.Errorf("CreateSnapshotPoint: %v", &sp)
	}

	var d parityv1.Diff
	g.call(t, ctx, "StartDiff", `{"scope": "full"}`, &d)
	if d.GetName() == "" || d.GetScope() != "full" {
		t.Fatalf("StartDiff: %v", &d)
	}
	msgs := g.call(t, ctx, "WatchDiff", fmt.Sprintf(`{"name": %q, "interval": "0.5s"}`, d.GetName()), &d)
	if d.GetState() != parityv1.DiffState_DIFF_STATE_DONE || d.GetResult() != parityv1.DiffResult_DIFF_RESULT_EQUAL || d.GetFirstTs() == 0 {
		t.Fatalf("WatchDiff's last message: %v", &d)
	}
	if len(msgs) < 2 {
		t.Errorf("WatchDiff sent %d messages, want the run at once and at its end", len(msgs))
	}
	var list parityv1.ListDiffsResponse
	g.call(t, ctx, "ListDiffs", `{"trigger": "manual", "page_size": 10}`, &list)
	if len(list.GetDiffs()) != 1 || list.GetDiffs()[0].GetName() != d.GetName() {
		t.Errorf("ListDiffs: %v", list.GetDiffs())
	}

	id, row := e.deletedSince(t, d.GetFirstTs())
	g.call(t, ctx, "WaitForApplied", `{"now": true, "timeout": "120s"}`, nil)
	e.inject(t, id, row)

	var cc parityv1.CutoverCheckResponse
	g.call(t, ctx, "CutoverCheck", `{"now": true}`, &cc)
	checkCutoverFound(t, e, &cc, id)
	var ld parityv1.ListDifferencesResponse
	g.call(t, ctx, "ListDifferences", fmt.Sprintf(`{"parent": %q}`, cc.GetDiff()), &ld)
	if ld.GetTotalSize() != 1 || len(ld.GetDifferences()) != 1 || ld.GetDifferences()[0].GetKey() != fmt.Sprintf("id=%d", id) {
		t.Errorf("ListDifferences: %v", &ld)
	}
	var fix parityv1.FixSQLChunk
	g.call(t, ctx, "GetFixSQL", fmt.Sprintf(`{"parent": %q}`, cc.GetDiff()), &fix)
	if !strings.Contains(fix.GetSql(), "DELETE FROM") || !strings.Contains(fix.GetSql(), strconv.FormatInt(id, 10)) {
		t.Errorf("GetFixSQL: %v", &fix)
	}

	var rep parityv1.RepairResponse
	g.call(t, ctx, "Repair", fmt.Sprintf(`{"diff": %q, "dry_run": true}`, cc.GetDiff()), &rep)
	if !rep.GetDryRun() || rep.GetDeleted() != 1 || !e.fallbackHas(t, id) {
		t.Errorf("Repair dry run: %v", &rep)
	}
	g.call(t, ctx, "Repair", fmt.Sprintf(`{"diff": %q}`, cc.GetDiff()), &rep)
	if rep.GetDeleted() != 1 || rep.GetVerifyResult() != parityv1.DiffResult_DIFF_RESULT_EQUAL || e.fallbackHas(t, id) {
		t.Errorf("Repair: %v", &rep)
	}

	e.stopWrites(t)
	g.call(t, ctx, "WaitForApplied", `{"now": true, "timeout": "120s"}`, &w)
	g.call(t, ctx, "CutoverCheck", `{"now": true}`, &cc)
	if !cc.GetPassed() || len(cc.GetFailures()) > 0 || len(cc.GetDifferences()) > 0 {
		t.Errorf("CutoverCheck after the workload stopped: %v", &cc)
	}

	// An unknown run: NotFound with ErrorInfo reason DIFF_NOT_FOUND in -format-error's JSON.
	code, out, errs = g.run(t, ctx, []string{"-d", `{"name": "diffs/v20000101T000000-00000000"}`}, "parity.v1.Parity/GetDiff")
	if c, reason := grpcurlError(t, out, errs); code != 64+5 || c != 5 || reason != "DIFF_NOT_FOUND" {
		t.Errorf("GetDiff of an unknown run: exit %d, want 69 (NotFound)\n%s%s", code, out, errs)
	}
}

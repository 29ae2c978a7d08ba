package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"golang.org/x/sync/errgroup"

	"github.com/tidb-parity/parity/checker"
)

// parityReport is the part of report.json the benchmark reads.
type parityReport struct {
	RunID  string `json:"run_id"`
	Tables []struct {
		Schema           string `json:"schema"`
		Table            string `json:"table"`
		RowsChecked      int64  `json:"rows_checked"`
		Chunks           int    `json:"chunks"`
		DifferencesTotal int64  `json:"differences_total"`
		FixSQLFile       string `json:"fix_sql_file"`
		Differences      []struct {
			Kind    string            `json:"kind"`
			Key     map[string]string `json:"key"`
			Columns []string          `json:"columns"`
		} `json:"differences"`
	} `json:"tables"`
}

// runParity runs `parity diff` over the pair as a subprocess and reads its report.json.
// It returns an error only when parity could not be run or its output not read; a wrong
// result is recorded in Result.Err and reported as a MISS.
func runParity(ctx context.Context, o options, p *pair, dir string) (Result, error) {
	out := filepath.Join(dir, "output")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Result{}, err
	}
	args := []string{"diff",
		"--upstream", p.up.S.DSN, "--downstream", p.down.S.DSN,
		"--table", p.up.DB + "." + p.up.Name,
		"--output", out,
	}
	args = append(args, strings.Fields(o.parityArgs)...)
	cmd := exec.CommandContext(ctx, o.parity, args...)
	logPath := filepath.Join(dir, "parity.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return Result{}, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "$ %s %s\n", o.parity, strings.Join(args, " "))
	cmd.Stdout, cmd.Stderr = logf, logf
	res, err := timeProcess(cmd)
	if err != nil {
		return res, fmt.Errorf("run parity (log %s): %w", logPath, err)
	}
	code := cmd.ProcessState.ExitCode()
	if code != 0 && code != 1 {
		return res, fmt.Errorf("parity diff %s exited %d (log %s)", p.label, code, logPath)
	}
	data, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		return res, fmt.Errorf("parity diff %s: %w (log %s)", p.label, err, logPath)
	}
	var rep parityReport
	if err := json.Unmarshal(data, &rep); err != nil {
		return res, fmt.Errorf("parity diff %s: decode report.json: %w", p.label, err)
	}
	res.runID = rep.RunID
	var total int64
	for _, t := range rep.Tables {
		res.Chunks += t.Chunks
		if t.FixSQLFile != "" {
			res.fixFile = filepath.Join(out, t.FixSQLFile)
		}
		total += t.DifferencesTotal
		for _, d := range t.Differences {
			id, err := strconv.ParseInt(d.Key["id"], 10, 64)
			if err != nil {
				return res, fmt.Errorf("parity report: difference key %v: %w", d.Key, err)
			}
			f := Difference{Kind: DiffKind(d.Kind), ID: id, Column: strings.Join(d.Columns, ",")}
			res.Found = append(res.Found, f)
		}
	}
	var problems []string
	if total != int64(len(res.Found)) {
		problems = append(problems, fmt.Sprintf("differences_total %d but %d listed", total, len(res.Found)))
	}
	if wantCode := map[bool]int{true: 1, false: 0}[total > 0]; code != wantCode {
		problems = append(problems, fmt.Sprintf("exit code %d with %d differences", code, total))
	}
	if len(problems) > 0 {
		res.Err = fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return res, nil
}

// chunkRange is a chunk's key range as parity persisted it.
type chunkRange struct {
	seq    int
	lo, hi string // its bounds as stored (checker.ChunkSQL reads them)
	count  int64  // upstream rows parity counted in it
}

// parityChunks reads the chunk ranges of a finished parity run from the meta schema
// (parity_meta.diff_chunks on the downstream).
func parityChunks(ctx context.Context, p *pair, runID string) ([]chunkRange, error) {
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if runID == "" {
		return nil, fmt.Errorf("report.json has no run_id: cannot find parity's chunks")
	}
	rows, err := p.down.S.DB.QueryContext(qctx, "SELECT seq, lo_bound, hi_bound, IFNULL(up_count,0) FROM parity_meta.diff_chunks WHERE run_id = ? ORDER BY table_idx, seq", runID)
	if err != nil {
		return nil, fmt.Errorf("read parity chunks of run %s: %w", runID, err)
	}
	defer rows.Close()
	var out []chunkRange
	for rows.Next() {
		var c chunkRange
		if err := rows.Scan(&c.seq, &c.lo, &c.hi, &c.count); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("run %s has no chunks in parity_meta.diff_chunks", runID)
	}
	return out, nil
}

// engineConfig is the engine's configuration of the parity run the bare loop follows:
// its --hash and --tidb-checksum.
func engineConfig(o options) checker.Config {
	cfg := checker.DefaultConfig()
	if h, ok := parityFlag(o.parityArgs, "hash"); ok {
		cfg.Hash = checker.Hash(h)
	}
	if mode, ok := parityFlag(o.parityArgs, "tidb-checksum"); ok {
		cfg.TiDBChecksum = checker.TiDBChecksum(mode)
	}
	return cfg
}

// runFloor is the bare loop: parity's per-chunk checksum SQL over the chunk ranges of the
// parity run just before it (par), both sides of a chunk at once, `concurrency` chunks at a time — what the
// engine's compare phase costs with nothing else (no boundary walk, no state writes, no
// drill-down).
// runFloor times the bare loop: parity's checksum query (bound "") or one of the
// lower-bound queries (checker.ChunkSQL.LowerBound: "read", "crc32") over parity's
// chunks, both sides of a chunk at once, at parity's concurrency.
func runFloor(ctx context.Context, o options, p *pair, par Result, bound string) (Result, error) {
	chunks, err := parityChunks(ctx, p, par.runID)
	if err != nil {
		return Result{}, err
	}
	conc := o.concurrency
	up, err := checker.OpenDSN(ctx, p.up.S.DSN, conc, "", checker.DefaultConfig().QueryTimeout)
	if err != nil {
		return Result{}, err
	}
	defer up.Close()
	down, err := checker.OpenDSN(ctx, p.down.S.DSN, conc, "", checker.DefaultConfig().QueryTimeout)
	if err != nil {
		return Result{}, err
	}
	defer down.Close()
	// The checksum SQL parity's run used: planned as it plans, with its --hash and
	// --tidb-checksum.
	plan, err := checker.PlanChunkSQL(ctx, up, down, engineConfig(o), p.up.DB, p.up.Name, p.down.DB, p.down.Name)
	if err != nil {
		return Result{}, err
	}
	// Open the connections before the clock starts, as parity's pool has by then.
	if err := warm(ctx, up, conc); err != nil {
		return Result{}, err
	}
	if err := warm(ctx, down, conc); err != nil {
		return Result{}, err
	}

	var mismatched atomic.Int64
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(conc)
	for _, c := range chunks {
		g.Go(func() error {
			var cnt [2]int64
			var sum [2]string
			var queries [2]string
			var err error
			if bound != "" {
				queries, err = plan.LowerBound(bound, c.lo, c.hi)
			} else {
				queries, err = plan.Checksum(c.lo, c.hi)
			}
			if err != nil {
				return fmt.Errorf("chunk %d: %w", c.seq, err)
			}
			sg, sctx := errgroup.WithContext(gctx)
			for s, src := range []*checker.DSNSource{up, down} {
				sg.Go(func() error {
					qctx, cancel := context.WithTimeout(sctx, 5*time.Minute)
					defer cancel()
					if bound != "" {
						// Only the count is compared; the other columns are read and dropped.
						rows, err := src.DB().QueryContext(qctx, queries[s])
						if err != nil {
							return err
						}
						defer rows.Close()
						cols, err := rows.Columns()
						if err != nil {
							return err
						}
						dst := make([]any, len(cols))
						dst[0] = &cnt[s]
						for i := 1; i < len(dst); i++ {
							dst[i] = new(sql.RawBytes)
						}
						if !rows.Next() {
							return fmt.Errorf("no row: %w", rows.Err())
						}
						return rows.Scan(dst...)
					}
					return src.DB().QueryRowContext(qctx, queries[s]).Scan(&cnt[s], &sum[s])
				})
			}
			if err := sg.Wait(); err != nil {
				return fmt.Errorf("chunk %d: %w", c.seq, err)
			}
			if cnt[0] != cnt[1] || sum[0] != sum[1] {
				mismatched.Add(1)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return Result{}, fmt.Errorf("bare loop %s %s: %w", bound, p.label, err)
	}
	res := Result{Wall: time.Since(start), Chunks: len(chunks)}
	res.Note = fmt.Sprintf("%d chunks mismatched, concurrency %d", mismatched.Load(), conc)
	return res, nil
}

func warm(ctx context.Context, s *checker.DSNSource, n int) error {
	g, gctx := errgroup.WithContext(ctx)
	for i := 0; i < n; i++ {
		g.Go(func() error {
			_, release, err := s.Acquire(gctx)
			if err != nil {
				return err
			}
			time.Sleep(10 * time.Millisecond) // hold it so the others open new ones
			release()
			return nil
		})
	}
	return g.Wait()
}

// engineHashSQL returns parity's whole-table checksum query on t for each of the engine's
// hashes (the plan compares t with itself; only the upstream side's SQL is used).
func engineHashSQL(ctx context.Context, t *Table) (map[checker.Hash]string, error) {
	src, err := checker.OpenDSN(ctx, t.S.DSN, 1, "", checker.DefaultConfig().QueryTimeout)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	whole := func(h checker.Hash, mode checker.TiDBChecksum) (string, error) {
		cfg := checker.DefaultConfig()
		cfg.Hash, cfg.TiDBChecksum = h, mode
		plan, err := checker.PlanChunkSQL(ctx, src, src, cfg, t.DB, t.Name, t.DB, t.Name)
		if err != nil {
			return "", err
		}
		q, err := plan.Checksum("", "")
		return q[0], err
	}
	out := map[checker.Hash]string{}
	for _, h := range []checker.Hash{checker.HashSHA1, checker.HashMD5, checker.HashCRC32Pair} {
		if out[h], err = whole(h, checker.TiDBChecksumTiDB); err != nil {
			return nil, err
		}
	}
	if src.Flavor() == checker.FlavorTiDB {
		// The form TiDB pushes down to its coprocessor (tidb_checksum = "pushdown", the
		// choice on TiKV stores; unistore evaluates it row by row).
		if out[pushdownSHA1], err = whole(checker.HashSHA1, checker.TiDBChecksumPushdown); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// pushdownSHA1 keys engineHashSQL's pushdown form of the default hash.
const pushdownSHA1 checker.Hash = "sha1 pushdown"

// applyFix runs parity's fix SQL file on the downstream copy (binlog off on MariaDB) and
// checks that the copy then holds exactly the dataset again.
func applyFix(ctx context.Context, t *Table, file string, want Expected) (bool, string, error) {
	if file == "" {
		return false, "report.json names no fix SQL file", nil
	}
	script, err := os.ReadFile(file)
	if err != nil {
		return false, "", err
	}
	cfg, err := mysql.ParseDSN(t.S.DSN)
	if err != nil {
		return false, "", err
	}
	cfg.MultiStatements = true
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return false, "", err
	}
	defer db.Close()
	qctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	conn, err := db.Conn(qctx)
	if err != nil {
		return false, "", err
	}
	defer conn.Close()
	if !t.S.TiDB {
		if _, err := conn.ExecContext(qctx, "SET SESSION sql_log_bin = 0"); err != nil {
			return false, "", err
		}
	}
	if _, err := conn.ExecContext(qctx, string(script)); err != nil {
		return false, fmt.Sprintf("applying %s failed: %v", file, err), nil
	}
	got, err := t.Checksum(ctx)
	if err != nil {
		return false, "", err
	}
	if got != want {
		return false, fmt.Sprintf("after the fix SQL the downstream has %d rows and checksum %d/%d, the upstream dataset %d rows and %d/%d",
			got.Count, got.Xor, got.Sum, want.Count, want.Xor, want.Sum), nil
	}
	return true, fmt.Sprintf("%d bytes of fix SQL; downstream equals the dataset afterwards", len(script)), nil
}

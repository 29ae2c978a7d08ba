package api

// diffs.go holds the RPCs of verification runs and what they found: StartDiff, GetDiff,
// WatchDiff, CancelDiff, ListDiffs, ListDifferences and GetFixSQL, with the checks of
// their request fields (patterns, run names, page sizes). server.go holds the server
// and the other RPCs.

import (
	"context"
	"fmt"
	"strings"
	"time"

	parityv1 "github.com/tidb-parity/parity/api/parity/v1"
	"github.com/tidb-parity/parity/checker"
	"github.com/tidb-parity/parity/checker/verify"
)

// StartDiff implements parityv1.ParityServer.
func (s *Server) StartDiff(ctx context.Context, req *parityv1.StartDiffRequest) (*parityv1.Diff, error) {
	v, err := s.verification()
	if err != nil {
		return nil, err
	}
	// The service checks the request (scope, tables, limits) once; its errors name the
	// field, mapped to the request's (requestField).
	dr := verify.Request{Scope: strings.TrimSpace(req.GetScope())}
	if dr.Tables, err = patterns("tables", req.GetTables()); err != nil {
		return nil, err
	}
	if p := req.GetSnapshotPolicy(); p != nil {
		if p.MaxViewAge != nil {
			if dr.MaxViewAge, err = positive("snapshot_policy.max_view_age", p.MaxViewAge, 0); err != nil {
				return nil, err
			}
		}
		dr.MinTS, dr.AtTS = p.GetMinTs(), p.GetAtTs()
	}
	if o := req.GetOptions(); o != nil {
		if o.MaxRowsPerSecond < 0 {
			return nil, fieldErr("options.max_rows_per_second", "must not be negative, got %d", o.MaxRowsPerSecond)
		}
		dr.MaxRowsPerSecond = o.MaxRowsPerSecond
	}
	started, err := v.Trigger(ctx, dr)
	if err != nil {
		return nil, withTS(dr.AtTS, requestField(err, startDiffFields))
	}
	id := started.RunID
	rec, active, err := v.Get(ctx, id)
	if err != nil {
		return nil, withRun(id, err)
	}
	return diffProto(rec, active, s.b.Instance), nil
}

// patterns validates schema.table patterns of field.
func patterns(field string, ps []string) ([]string, error) {
	var out []string
	for i, p := range ps {
		p = strings.TrimSpace(p)
		if err := checker.CheckTablePattern(p); err != nil {
			return nil, &FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Err: err}
		}
		out = append(out, p)
	}
	return out, nil
}

// runID returns the run id of a "diffs/{run_id}" name (a bare id too).
func runID(field, name string) (string, error) {
	name = strings.TrimSpace(name)
	id := strings.TrimPrefix(name, "diffs/")
	switch {
	case name == "":
		return "", fieldErr(field, `required: "diffs/{run_id}"`)
	case id == "" || strings.ContainsAny(id, "/ \t"):
		return "", fieldErr(field, `want "diffs/{run_id}", got %q`, name)
	}
	return id, nil
}

// GetDiff implements parityv1.ParityServer.
func (s *Server) GetDiff(ctx context.Context, req *parityv1.GetDiffRequest) (*parityv1.Diff, error) {
	v, id, err := s.verificationRun("name", req.GetName())
	if err != nil {
		return nil, err
	}
	rec, active, err := v.Get(ctx, id)
	if err != nil {
		return nil, withRun(id, err)
	}
	return diffProto(rec, active, s.b.Instance), nil
}

// WatchDiff implements parityv1.ParityServer.
func (s *Server) WatchDiff(req *parityv1.WatchDiffRequest, stream parityv1.Parity_WatchDiffServer) error {
	v, id, err := s.verificationRun("name", req.GetName())
	if err != nil {
		return err
	}
	every, err := interval("interval", req.GetInterval(), watchDiffDefault, watchDiffMin, watchDiffMax)
	if err != nil {
		return err
	}
	ctx := stream.Context()
	// The run's end wakes the stream for its final message, whatever the interval (nil
	// when this daemon does not run it: then the interval finds its end).
	return s.every(ctx, every, v.Ended(id), func() (bool, error) {
		rec, active, err := v.Get(ctx, id)
		if err != nil {
			return false, withRun(id, err)
		}
		if err := stream.Send(diffProto(rec, active, s.b.Instance)); err != nil {
			return false, err
		}
		return active == nil && rec.State != verify.StateRunning, nil
	})
}

// CancelDiff implements parityv1.ParityServer.
func (s *Server) CancelDiff(ctx context.Context, req *parityv1.CancelDiffRequest) (*parityv1.Diff, error) {
	v, id, err := s.verificationRun("name", req.GetName())
	if err != nil {
		return nil, err
	}
	rec, err := v.Cancel(ctx, id)
	if err != nil {
		return nil, withRun(id, err)
	}
	return diffProto(rec, nil, s.b.Instance), nil
}

// pageSize returns the page size of a request: def when 0, at most hi.
func pageSize(n int32, def, hi int) (int, error) {
	switch {
	case n < 0:
		return 0, fieldErr("page_size", "must not be negative, got %d", n)
	case n == 0:
		return def, nil
	}
	return min(int(n), hi), nil
}

// ListDiffs implements parityv1.ParityServer.
func (s *Server) ListDiffs(ctx context.Context, req *parityv1.ListDiffsRequest) (*parityv1.ListDiffsResponse, error) {
	v, err := s.verification()
	if err != nil {
		return nil, err
	}
	size, err := pageSize(req.GetPageSize(), listDiffsDefault, listDiffsMax)
	if err != nil {
		return nil, err
	}
	f := verify.ListFilter{Trigger: strings.TrimSpace(req.GetTrigger())}
	if req.GetState() != parityv1.DiffState_DIFF_STATE_UNSPECIFIED {
		if f.State = stateName(req.GetState()); f.State == "" {
			return nil, fieldErr("state", "%s is not a state runs are listed by (queued runs are listed as DIFF_STATE_RUNNING)", req.GetState())
		}
	}
	for _, t := range []struct {
		field string
		dst   *time.Time
		ts    interface {
			CheckValid() error
			AsTime() time.Time
		}
		set bool
	}{
		{"start_time_after", &f.StartedAfter, req.GetStartTimeAfter(), req.GetStartTimeAfter() != nil},
		{"start_time_before", &f.StartedBefore, req.GetStartTimeBefore(), req.GetStartTimeBefore() != nil},
	} {
		if !t.set {
			continue
		}
		if err := t.ts.CheckValid(); err != nil {
			return nil, fieldErr(t.field, "%v", err)
		}
		*t.dst = t.ts.AsTime()
	}
	filter := filterKey("diffs", req.GetState().String(), f.Trigger, fmtTime(f.StartedAfter), fmtTime(f.StartedBefore))
	offset, err := decodePageToken(req.GetPageToken(), filter)
	if err != nil {
		return nil, err
	}
	f.Offset, f.Limit = offset, size
	recs, err := v.List(ctx, f)
	if err != nil {
		return nil, err
	}
	resp := &parityv1.ListDiffsResponse{}
	if len(recs) == size { // a next page when a run follows
		f.Offset, f.Limit = offset+size, 1
		more, err := v.List(ctx, f)
		if err != nil {
			return nil, err
		}
		if len(more) > 0 {
			resp.NextPageToken = encodePageToken(offset+size, filter)
		}
	}
	for _, r := range recs {
		resp.Diffs = append(resp.Diffs, diffProto(r, nil, s.b.Instance))
	}
	return resp, nil
}

// ListDifferences implements parityv1.ParityServer.
func (s *Server) ListDifferences(ctx context.Context, req *parityv1.ListDifferencesRequest) (*parityv1.ListDifferencesResponse, error) {
	v, id, err := s.verificationRun("parent", req.GetParent())
	if err != nil {
		return nil, err
	}
	size, err := pageSize(req.GetPageSize(), listDiffsDefault2, listDiffsMax)
	if err != nil {
		return nil, err
	}
	var tables []string
	if t := strings.TrimSpace(req.GetTable()); t != "" {
		if err := checker.CheckTablePattern(t); err != nil {
			return nil, &FieldError{Field: "table", Err: err}
		}
		tables = []string{t}
	}
	var kind checker.DiffKind
	if k := req.GetKind(); k != parityv1.DifferenceKind_DIFFERENCE_KIND_UNSPECIFIED {
		if kind = kindName(k); kind == "" {
			return nil, fieldErr("kind", "unknown kind %d", k)
		}
	}
	class := strings.TrimSpace(req.GetClass())
	filter := filterKey("differences", id, strings.Join(tables, ","), string(kind), class)
	offset, err := decodePageToken(req.GetPageToken(), filter)
	if err != nil {
		return nil, err
	}
	all, err := v.Differences(ctx, id, tables)
	if err != nil {
		return nil, withRun(id, tablesField(err))
	}
	var match []checker.StoredDifference
	for _, d := range all {
		if (kind == "" || d.Kind == kind) && (class == "" || d.Class == class) {
			match = append(match, d)
		}
	}
	resp := &parityv1.ListDifferencesResponse{TotalSize: int64(len(match))}
	if offset < len(match) {
		page := match[offset:]
		if len(page) > size {
			page = page[:size]
			resp.NextPageToken = encodePageToken(offset+size, filter)
		}
		for _, d := range page {
			resp.Differences = append(resp.Differences, differenceProto(d))
		}
	}
	return resp, nil
}

// GetFixSQL implements parityv1.ParityServer.
func (s *Server) GetFixSQL(req *parityv1.GetFixSQLRequest, stream parityv1.Parity_GetFixSQLServer) error {
	v, id, err := s.verificationRun("parent", req.GetParent())
	if err != nil {
		return err
	}
	var tables []string
	if t := strings.TrimSpace(req.GetTable()); t != "" {
		if err := checker.CheckTablePattern(t); err != nil {
			return &FieldError{Field: "table", Err: err}
		}
		tables = []string{t}
	}
	// Statements of one table are sent together, in chunks of about 64 KiB.
	var (
		table string
		buf   strings.Builder
	)
	flush := func() error {
		if buf.Len() == 0 {
			return nil
		}
		err := stream.Send(&parityv1.FixSQLChunk{Table: table, Sql: buf.String()})
		buf.Reset()
		return err
	}
	err = v.FixSQL(stream.Context(), id, tables, func(t, sql string) error {
		if t != table || buf.Len()+len(sql) > fixChunkBytes {
			if err := flush(); err != nil {
				return err
			}
			table = t
		}
		buf.WriteString(sql)
		return nil
	})
	if err != nil {
		return withRun(id, tablesField(err))
	}
	return flush()
}

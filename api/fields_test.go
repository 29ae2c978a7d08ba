package api

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tidb-parity/parity/checker/verify"
)

// requestField names the API request field of verify's invalid-request errors by their
// typed field, per RPC; other errors pass through unchanged.
func TestRequestField(t *testing.T) {
	other := errors.New("downstream unreachable")
	for _, tc := range []struct {
		name   string
		err    error
		fields map[string]string
		want   string // "" : no FieldError
	}{
		{"start diff scope", &verify.RequestError{Field: verify.FieldScope, Err: errors.New("unknown scope")}, startDiffFields, "scope"},
		{"start diff view age", &verify.RequestError{Field: verify.FieldMaxViewAge, Err: errors.New("max view age")}, startDiffFields, "snapshot_policy.max_view_age"},
		{"start diff min ts", fmt.Errorf("trigger: %w", &verify.RequestError{Field: verify.FieldMinTS, Err: errors.New("x")}), startDiffFields, "snapshot_policy.min_ts"},
		{"start diff rate", &verify.RequestError{Field: verify.FieldMaxRowsPerSecond, Err: errors.New("x")}, startDiffFields, "options.max_rows_per_second"},
		{"cutover upstream", &verify.RequestError{Field: verify.FieldUpstreamTS, Err: errors.New("x")}, cutoverFields, "upstream"},
		{"cutover full age", &verify.RequestError{Field: verify.FieldMaxFullAge, Err: errors.New("x")}, cutoverFields, "max_full_diff_age"},
		{"cutover wait", &verify.RequestError{Field: verify.FieldWaitTimeout, Err: errors.New("x")}, cutoverFields, "wait_timeout"},
		{"cutover tables", &verify.RequestError{Field: verify.FieldTables, Err: errors.New("x")}, cutoverFields, "tables"},
		{"a field the RPC does not have", &verify.RequestError{Field: verify.FieldMinTS, Err: errors.New("x")}, cutoverFields, ""},
		{"not a request error", other, startDiffFields, ""},
	} {
		got := requestField(tc.err, tc.fields)
		var fe *FieldError
		switch ok := errors.As(got, &fe); {
		case tc.want == "" && ok:
			t.Errorf("%s: field %q, want none", tc.name, fe.Field)
		case tc.want != "" && (!ok || fe.Field != tc.want):
			t.Errorf("%s: %v (%+v), want field %q", tc.name, got, fe, tc.want)
		case !errors.Is(got, tc.err):
			t.Errorf("%s: %v no longer matches the error it names", tc.name, got)
		}
	}
}

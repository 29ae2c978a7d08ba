package api

// fields.go maps the verification service's request errors (verify.RequestError, which
// names verify's field) to the fields of the API's requests: the one translation of a
// refused request into the API's words (InvalidArgument with the field's path).

import (
	"errors"

	"github.com/tidb-parity/parity/checker/verify"
)

// startDiffFields and cutoverFields map verify's request fields to StartDiffRequest's and
// CutoverCheckRequest's field paths.
var (
	startDiffFields = map[string]string{
		verify.FieldScope:            "scope",
		verify.FieldTables:           "tables",
		verify.FieldMaxViewAge:       "snapshot_policy.max_view_age",
		verify.FieldMinTS:            "snapshot_policy.min_ts",
		verify.FieldAtTS:             "snapshot_policy.at_ts",
		verify.FieldMaxRowsPerSecond: "options.max_rows_per_second",
	}
	cutoverFields = map[string]string{
		verify.FieldFullTables:  "full_tables",
		verify.FieldTables:      "tables",
		verify.FieldUpstreamTS:  "upstream", // the oneof: upstream_ts or now
		verify.FieldMaxFullAge:  "max_full_diff_age",
		verify.FieldWaitTimeout: "wait_timeout",
	}
)

// requestField names, for the API, the request field (through fields) of an invalid
// request's error (verify.RequestError); other errors are returned as they are.
func requestField(err error, fields map[string]string) error {
	var re *verify.RequestError
	if !errors.As(err, &re) {
		return err
	}
	if f, ok := fields[re.Field]; ok {
		return &FieldError{Field: f, Err: err}
	}
	return err
}

// tablesField names the table filter in an invalid request to Differences and FixSQL
// (the API's single table field).
func tablesField(err error) error {
	if errors.Is(err, verify.ErrInvalidRequest) {
		return &FieldError{Field: "table", Err: err}
	}
	return err
}

package open

import (
	"errors"

	"github.com/tidb-parity/parity/cdc/internal/jsonscan"
)

// The JSON text of keys, row values and DDL values is read with cdc/internal/jsonscan,
// the scanner the canal-json and simple decoders use too. Its errors become this
// package's syntaxError (see fromScan) before they reach a DecodeError, so the error
// texts and sentinels are this package's.

// syntaxError is a failure at a byte position of the JSON text.
type syntaxError struct {
	pos int
	msg string
	err error // sentinel, ErrSyntax unless stated
}

func (e *syntaxError) Error() string { return e.msg }
func (e *syntaxError) Unwrap() error { return e.err }

// fromScan turns a scanner error into a syntaxError with the sentinel of its kind
// (ErrSyntax, ErrValue for a value of the wrong JSON type, ErrNesting); other errors
// are returned unchanged.
func fromScan(err error) error {
	je, ok := err.(*jsonscan.Error)
	if !ok {
		return err
	}
	sentinel := ErrSyntax
	switch je.Kind {
	case jsonscan.WrongType:
		sentinel = ErrValue
	case jsonscan.Nesting:
		sentinel = ErrNesting
	}
	return &syntaxError{pos: je.Pos, msg: je.Msg, err: sentinel}
}

// asSyntax extracts the position of a scanner error.
func asSyntax(err error) (*syntaxError, bool) {
	var se *syntaxError
	ok := errors.As(err, &se)
	return se, ok
}

// boolean reads true, false, or null (as false).
func boolean(s *jsonscan.Scanner) (bool, error) {
	switch s.Peek() {
	case 't':
		return true, s.Literal("true")
	case 'f':
		return false, s.Literal("false")
	case 'n':
		return false, s.Literal("null")
	}
	return false, s.WrongType("a boolean")
}

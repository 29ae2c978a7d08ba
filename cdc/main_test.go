package cdc

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// database/sql's connection opener lives as long as a *sql.DB the testenv keeps
		// open until its cleanup.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

package checker

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashChildEnv) != "" {
		crashChild() // the child process of TestCrashAndResume: never returns
	}
	goleak.VerifyTestMain(m)
}

package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// parityBin is the parity binary the tests run: $PARITY_BIN (make test passes the
// bin/parity it built) or one built from the repository for this run.
var parityBin string

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploy tests:", err)
		os.Exit(2)
	}
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	if p := os.Getenv("PARITY_BIN"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			return 0, err
		}
		parityBin = abs
		return m.Run(), nil
	}
	dir, err := os.MkdirTemp("", "parity-deploy-test-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	parityBin = filepath.Join(dir, "parity")
	goBin := os.Getenv("GO")
	if goBin == "" {
		goBin = "go"
	}
	cmd := exec.Command(goBin, "build", "-o", parityBin, "./cmd/parity")
	cmd.Dir = ".."
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("build parity: %w", err)
	}
	return m.Run(), nil
}

package api

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any leave a goroutine behind (gRPC servers,
// clients, signal loops).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

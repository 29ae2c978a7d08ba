package loadgen

import (
	"testing"

	"go.uber.org/goleak"
)

// The generator starts workers, a publisher and Kafka connections; none may outlive Run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

package instance

import (
	"fmt"
	"os"
	"testing"
)

func TestDefaultInstance(t *testing.T) {
	host, _ := os.Hostname()
	want := fmt.Sprintf("%s:%d", host, os.Getpid())
	if len(want) > MaxLen {
		want = want[len(want)-MaxLen:]
	}
	if got := DefaultInstance(); got != want {
		t.Fatalf("DefaultInstance() = %q, want %q", got, want)
	}
}

package bufconn

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
)

// TestConn: what the peer writes arrives whole and in order through reads of every size
// (smaller and larger than the buffer), writes reach the peer, and SyscallConn gives the
// raw socket of a TCP connection and ErrUnsupported for one without any.
func TestConn(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i*7 + i>>11)
	}
	done := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer s.Close()
		if _, err := s.Write(want); err != nil {
			done <- err
			return
		}
		ping := make([]byte, 4)
		if _, err := io.ReadFull(s, ping); err != nil || string(ping) != "ping" {
			done <- errors.Join(err, errors.New("no ping: "+string(ping)))
			return
		}
		done <- nil
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c := New(raw, 4096)
	defer c.Close()
	var got []byte
	for _, n := range []int{1, 100, 4095, 4096, 4097, 65536, 3} {
		p := make([]byte, n)
		m, err := io.ReadFull(c, p)
		if err != nil {
			t.Fatalf("read of %d: %v", n, err)
		}
		got = append(got, p[:m]...)
	}
	rest, err := io.ReadAll(io.LimitReader(c, int64(len(want)-len(got))))
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, rest...)
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not what was written", len(got))
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.SyscallConn(); err != nil {
		t.Errorf("SyscallConn of a TCP connection: %v", err)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if _, err := New(a, 4096).SyscallConn(); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("SyscallConn of a pipe: %v, want ErrUnsupported", err)
	}
}

// Package bufconn puts a read buffer in front of a network connection. The clients parity
// uses read their connections in small pieces — go-sql-driver/mysql 4 KiB at a time,
// kafka-go through a 4 KiB bufio.Reader — so every large reply (a drill-down's rows, a
// Kafka record's value) costs system calls of its own; both were measured as a large
// share of parity's CPU. The checker (drill-down connections) and cdc (the partition
// readers' Kafka connections) cannot import each other, so the one wrapper lives here.
package bufconn

import (
	"bufio"
	"errors"
	"net"
	"syscall"
)

// Conn is a net.Conn whose reads go through a bufio.Reader; writes, deadlines and Close
// go to the connection as they are.
type Conn struct {
	net.Conn
	r *bufio.Reader
}

// New returns c reading through a buffer of size bytes.
func New(c net.Conn, size int) *Conn {
	return &Conn{Conn: c, r: bufio.NewReaderSize(c, size)}
}

func (c *Conn) Read(p []byte) (int, error) { return c.r.Read(p) }

// SyscallConn returns the raw connection of c (errors.ErrUnsupported when it has none, a
// TLS connection for one). Between a client's requests the buffer is empty (it has read
// every reply), so go-sql-driver's liveness check on the raw socket still sees what the
// server sent.
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

var _ syscall.Conn = (*Conn)(nil)

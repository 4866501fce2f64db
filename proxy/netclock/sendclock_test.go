//go:build unix

package netclock

import (
	"io"
	"net"
	"testing"
)

// TestClientWriteAllocatesNothing: the raw write that sees a full send
// buffer is on the per-event path, and allocates nothing.
func TestClientWriteAllocatesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	w := newSocketWriter(c)
	if w == nil {
		t.Fatal("no raw writer for a TCP connection")
	}
	event := []byte("data: {\"choices\":[{\"delta\":{\"content\":\" t\"}}]}\n\n")
	if allocs := testing.AllocsPerRun(1000, func() {
		if n, _, err := w.write(event); err != nil || n != len(event) {
			t.Fatalf("write: %d, %v", n, err)
		}
	}); allocs != 0 {
		t.Fatalf("a write allocates %v times", allocs)
	}
}

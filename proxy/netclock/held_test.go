package netclock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
)

// TestHeldRequestGoesWithTheNextRead: a request held for the next read
// reaches the peer whole, in order, from inside that read, whose answer
// is then read as any; one the socket has no room for at once is written
// whole all the same; and against a peer that has gone, the read reports
// the connection's end. Where a connection cannot hold one, the caller is
// told to write it.
func TestHeldRequestGoesWithTheNextRead(t *testing.T) {
	needKernelStamps(t)
	tests := []struct {
		name string
		size int
	}{
		{"small: one write", 300},
		// Larger than the socket buffers the peer's side is set to
		// below, so the write is short and the rest goes the ordinary way.
		{"larger than the socket takes at once", 4 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			peer, c := tcpPair(t, true)
			peer.(*net.TCPConn).SetReadBuffer(64 << 10) //nolint:errcheck // a hint; the size makes the write short anyway
			request := bytes.Repeat([]byte("r"), tt.size)
			if !c.SendWithNextRead(request) {
				t.Fatal("a kernel-stamped connection does not hold a request")
			}
			got := make(chan []byte, 1)
			go func() {
				b := make([]byte, tt.size)
				if _, err := io.ReadFull(peer, b); err != nil {
					got <- nil
					return
				}
				got <- b
				io.WriteString(peer, "answer") //nolint:errcheck // the read below checks
			}()
			buf := make([]byte, 16)
			n, err := c.Read(buf)
			if err != nil || string(buf[:n]) != "answer" {
				t.Fatalf("read %q, %v; want the answer", buf[:n], err)
			}
			if b := <-got; !bytes.Equal(b, request) {
				t.Fatalf("the peer got %d bytes, not the request", len(b))
			}
		})
	}
	t.Run("the peer gone", func(t *testing.T) {
		peer, c := tcpPair(t, true)
		peer.(*net.TCPConn).SetLinger(0) //nolint:errcheck // a reset, as a crashed engine's
		peer.Close()
		c.SendWithNextRead([]byte("request"))
		_, err := c.Read(make([]byte, 16))
		if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("read after the peer left: %v; want its end", err)
		}
	})
	t.Run("no kernel reads: not held", func(t *testing.T) {
		_, c := tcpPair(t, false)
		if c.SendWithNextRead([]byte("request")) {
			t.Fatal("a connection read the plain way holds a request")
		}
	})
}

package clientconn

import (
	"io"
	"net"
	"testing"
)

// BenchmarkWrite300B is one 300-byte event written to a loopback client
// that reads as fast as it can: through Conn (its write bookkeeping and
// the stall hook's guard) and, in the same run, to the stamped socket
// under it, so that the ratio is Conn's own cost per event.
func BenchmarkWrite300B(b *testing.B) {
	for _, tc := range []struct {
		name string
		w    func(*Conn) io.Writer
	}{
		{"socket", func(c *Conn) io.Writer { return c.recv }},
		{"conn", func(c *Conn) io.Writer { return c }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := net.Dial("tcp", ln.Addr().String())
				if err != nil {
					return
				}
				defer c.Close()
				io.Copy(io.Discard, c) //nolint:errcheck // until the server closes
			}()
			nc, err := Listener{Listener: ln}.Accept()
			if err != nil {
				b.Fatal(err)
			}
			c := nc.(*Conn)
			defer c.Close()
			c.OnStall(func() {})
			w := tc.w(c)
			event := make([]byte, 300)
			b.SetBytes(int64(len(event)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := w.Write(event); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

//go:build !unix

package netclock

import (
	"net"
	"time"
)

// socketWriter is the Unix raw writer that sees a full send buffer; other
// platforms write as net.Conn does and report no wait.
type socketWriter struct{ onBlock func() }

func newSocketWriter(net.Conn) *socketWriter { return nil }

func (*socketWriter) write([]byte) (int, time.Duration, error) { panic("unreachable") }

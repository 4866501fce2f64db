//go:build unix

package netclock

import (
	"syscall"
	"unsafe"
)

// Alive reports whether a pooled connection is still open, with a
// non-blocking peek: the engine may have closed it while it sat idle
// (uvicorn drops idle keep-alive connections after 5 s), and a request
// written to it would fail after the engine had closed its side. Bytes
// waiting on it, which nothing should send between responses, count as
// not open too. Under TLS the peek is of the TCP connection below.
func (c *Conn) Alive() bool {
	if c.peek == nil {
		if c.peek = newPeeker(c); c.peek == nil {
			return true // not a socket: the retry in RoundTrip catches a stale one
		}
	}
	p := c.peek
	p.open = false
	return p.raw.Read(p.peekFD) == nil && p.open
}

// peeker is a connection's liveness peek, made once: its buffer and its
// callback live with the connection, so a peek allocates nothing.
type peeker struct {
	raw    syscall.RawConn
	buf    [1]byte
	open   bool
	peekFD func(fd uintptr) bool
}

func newPeeker(c *Conn) *peeker {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	p := &peeker{raw: raw}
	p.peekFD = p.peekRaw
	return p
}

// peekRaw is the peek: 0 bytes, the engine closed it; bytes, something
// is there that should not be; EAGAIN, open and quiet. Raw: a
// non-blocking peek never blocks (see socketWriter.writeRaw).
func (p *peeker) peekRaw(fd uintptr) bool {
	_, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&p.buf[0])), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	p.open = errno == syscall.EAGAIN || errno == syscall.EWOULDBLOCK
	return true
}

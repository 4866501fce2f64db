//go:build unix

package netclock

import (
	"crypto/tls"
	"net"
	"syscall"
	"unsafe"
)

// Alive reports whether a pooled connection is still open, with a
// non-blocking peek: the engine may have closed it while it sat idle
// (uvicorn drops idle keep-alive connections after 5 s), and a request
// written to it would fail after the engine had closed its side.
func Alive(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	open := false
	var b [1]byte
	err = raw.Read(func(fd uintptr) bool {
		// 0 bytes: the engine closed it; bytes: nothing should be
		// there between responses; EAGAIN: open and quiet.
		// Raw: a non-blocking peek never blocks (see socketWriter.writeRaw).
		_, _, errno := syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		open = errno == syscall.EAGAIN || errno == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && open
}

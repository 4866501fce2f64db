//go:build unix

package netclock

import (
	"net"
	"syscall"
	"time"
	"unsafe"
)

// socketWriter writes to a socket and tells how long a write waited
// because the socket's send buffer was full: a client was not reading (or
// its network was slower than the stream). The kernel says so
// exactly (EAGAIN), where the time a write took would also count a thread
// the scheduler set aside. Its state lives with the connection and its
// callback is bound once, so a write allocates nothing.
type socketWriter struct {
	raw     syscall.RawConn
	p       []byte
	n       int
	errno   syscall.Errno
	blocked time.Time // when the write in progress first found no room
	writeFD func(fd uintptr) bool
	// onBlock, when set, runs when a write first finds no room, inside
	// the write; it must not block.
	onBlock func()
}

// newSocketWriter returns nil when c is not a socket it can write raw.
func newSocketWriter(c net.Conn) *socketWriter {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &socketWriter{raw: raw}
	w.writeFD = w.writeRaw
	return w
}

// write writes p whole, within the connection's write deadline, and
// returns how long it waited for room in the send buffer.
func (w *socketWriter) write(p []byte) (int, time.Duration, error) {
	w.p, w.n, w.errno, w.blocked = p, 0, 0, time.Time{}
	err := w.raw.Write(w.writeFD)
	w.p = nil // the caller's buffer is not kept
	var waited time.Duration
	if !w.blocked.IsZero() {
		waited = time.Since(w.blocked)
	}
	switch {
	case err != nil:
		// Closed, or past the write deadline: the poller's error.
		return w.n, waited, &net.OpError{Op: "write", Net: "tcp", Err: err}
	case w.errno != 0:
		return w.n, waited, &net.OpError{Op: "write", Net: "tcp", Err: w.errno}
	}
	return w.n, waited, nil
}

// writeRaw is the raw write: false asks the poller to wait for room.
// The socket is non-blocking, so the write never blocks, and it is made
// without telling the scheduler (RawSyscall, as recvmsg is): telling it
// buys nothing here and wakes the runtime's monitor thread whenever the
// process was idle, which on a sidecar between events cost a tenth of
// its CPU.
func (w *socketWriter) writeRaw(fd uintptr) bool {
	for w.n < len(w.p) {
		n, _, err := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&w.p[w.n])), uintptr(len(w.p)-w.n))
		switch err {
		case 0:
			w.n += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			if w.blocked.IsZero() {
				w.blocked = time.Now()
				if w.onBlock != nil {
					w.onBlock()
				}
			}
			return false
		default:
			w.errno = err
			return true
		}
	}
	return true
}

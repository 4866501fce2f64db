//go:build linux && (amd64 || arm64 || ppc64le || riscv64)

package netclock

import (
	"io"
	"net"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// kernelReader reads a TCP socket with recvmsg, receive timestamps on
// (SO_TIMESTAMPNS): each read comes with the kernel's receive time of the
// last segment it returned. Its message header and control buffer live
// with the connection, so a read allocates nothing.
type kernelReader struct {
	raw syscall.RawConn
	msg syscall.Msghdr
	iov syscall.Iovec
	// oob takes the control messages: one timestamp, with room to spare.
	// uint64s keep the headers in it aligned.
	oob [8]uint64
	// The read in progress, for readFD, which is bound once so a read
	// makes no closure.
	p      []byte
	n      int
	errno  syscall.Errno
	at     time.Time
	readFD func(fd uintptr) bool
	// stamped: the latest read's time is the kernel's (its control
	// messages carried one).
	stamped bool
	// held is a request to write before the next read waits
	// (Conn.SendWithNextRead); short, that the socket took only part.
	held  []byte
	short bool
}

// newKernelReader turns on receive timestamps for c, or returns nil when c
// is not a socket that takes them.
func newKernelReader(c net.Conn) *kernelReader {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil || serr != nil {
		return nil
	}
	k := &kernelReader{raw: raw}
	k.msg.Iov = &k.iov
	k.msg.Iovlen = 1
	k.readFD = k.recvmsg
	return k
}

// read reads into p and returns the receive time of what it read.
func (k *kernelReader) read(p []byte) (int, time.Time, error) {
	if len(p) == 0 {
		return 0, time.Time{}, nil
	}
	k.p, k.n, k.errno, k.short = p, 0, 0, false
	err := k.raw.Read(k.readFD)
	k.p = nil // the caller's buffer is not kept
	k.iov.Base = nil
	if k.short && err == nil {
		return 0, time.Time{}, errHeldShort // held keeps the rest
	}
	k.held = nil // written, or gone with the connection
	switch {
	case err != nil:
		// Closed, or past a deadline: the poller's error, as a plain
		// read returns it (net.ErrClosed, os.ErrDeadlineExceeded).
		return 0, time.Time{}, err
	case k.errno == syscall.ENOTSOCK || k.errno == syscall.EOPNOTSUPP:
		return 0, time.Time{}, errNoKernelRead
	case k.errno != 0:
		return 0, time.Time{}, &net.OpError{Op: "read", Net: "tcp", Err: k.errno}
	case k.n == 0:
		return 0, time.Time{}, io.EOF
	}
	return k.n, k.at, nil
}

// recvmsg is the raw read: false asks the poller to wait for data. The
// socket is non-blocking, so it is a RawSyscall (see socketWriter.writeRaw).
func (k *kernelReader) recvmsg(fd uintptr) bool {
	if len(k.held) > 0 {
		switch k.writeHeld(fd) {
		case heldWritten:
			return false // wait for the answer: it cannot be here yet
		case heldShort:
			k.short = true
			return true
		}
		// The write failed: the engine closed the connection, or
		// answered early and closed; the read says which.
	}
	k.iov.Base = &k.p[0]
	k.iov.SetLen(len(k.p))
	k.msg.Control = (*byte)(unsafe.Pointer(&k.oob[0]))
	k.msg.SetControllen(len(k.oob) * 8)
	for {
		n, _, errno := syscall.RawSyscall(syscall.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&k.msg)), 0)
		switch errno {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		case 0:
			k.n = int(n)
			if n > 0 {
				k.at = k.stamp()
			}
		default:
			k.errno = errno
		}
		return true
	}
}

// What writing a held request came to.
const (
	heldWritten = iota // all of it
	heldShort          // part: the socket had no room for the rest
	heldFailed         // the write failed
)

// writeHeld writes the held request, raw (see socketWriter.writeRaw).
func (k *kernelReader) writeHeld(fd uintptr) int {
	for len(k.held) > 0 {
		n, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&k.held[0])), uintptr(len(k.held)))
		switch errno {
		case 0:
			k.held = k.held[n:]
		case syscall.EINTR:
		case syscall.EAGAIN:
			return heldShort
		default:
			k.held = nil
			return heldFailed
		}
	}
	return heldWritten
}

// takeHeld returns what is left of a held request, and holds nothing.
func (k *kernelReader) takeHeld() []byte {
	held := k.held
	k.held = nil
	return held
}

// stamp is the receive time the last read's control messages carry, or
// the clock now if they carry none.
func (k *kernelReader) stamp() time.Time {
	k.stamped = true
	oob := unsafe.Slice((*byte)(unsafe.Pointer(&k.oob[0])), int(k.msg.Controllen))
	for len(oob) >= syscall.SizeofCmsghdr {
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&oob[0]))
		if int(h.Len) < syscall.SizeofCmsghdr || int(h.Len) > len(oob) {
			break
		}
		if h.Level == syscall.SOL_SOCKET && h.Type == syscall.SCM_TIMESTAMPNS &&
			int(h.Len) >= syscall.CmsgLen(int(unsafe.Sizeof(syscall.Timespec{}))) {
			ts := (*syscall.Timespec)(unsafe.Pointer(&oob[syscall.CmsgLen(0)]))
			return fromKernel(int64(ts.Sec), int64(ts.Nsec))
		}
		next := syscall.CmsgSpace(int(h.Len) - syscall.CmsgLen(0))
		if next > len(oob) {
			break
		}
		oob = oob[next:]
	}
	k.stamped = false
	return time.Now()
}

// KernelTimestamps reports whether this kernel stamps received TCP data: a
// socket takes the option. That socket stays open for the life of the
// process: the kernel switches receive timestamping on for the whole
// machine when the first socket asks, but lazily, in a work item, and off
// when the last one closes, so without a socket that keeps asking the
// first bytes of a new connection could come unstamped.
func KernelTimestamps() bool {
	keeper.once.Do(func() {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			fd, err = syscall.Socket(syscall.AF_INET6, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				return
			}
		}
		if syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1) != nil {
			syscall.Close(fd)
			return
		}
		keeper.fd, keeper.ok = fd, true
	})
	return keeper.ok
}

// keeper is the socket that keeps receive timestamping on.
var keeper struct {
	once sync.Once
	fd   int
	ok   bool
}

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
	k.p, k.n, k.errno = p, 0, 0
	err := k.raw.Read(k.readFD)
	k.p = nil // the caller's buffer is not kept
	k.iov.Base = nil
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

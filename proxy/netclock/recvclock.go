package netclock

import (
	"errors"
	"net"
	"syscall"
	"time"
)

// Conn is a connection whose reads record when the bytes they return
// arrived, so that a mark taken on those bytes is the time they reached
// the machine, not the time a goroutine got round to reading them. Under
// a CPU limit a sidecar's goroutine often runs milliseconds late; the
// kernel's receive time does not move with it.
//
// Where the kernel stamps TCP data (Linux, SO_TIMESTAMPNS), a read's time
// is the receive time of the last byte it returned: the segment that
// completed what the read hands over. Bytes that arrived while nobody read
// are merged by the kernel and carry the latest one's stamp, so several
// events read at once share the stamp of the last of them: the mark is
// then an upper bound, never later than the clock at the read. Elsewhere,
// and for a read with no stamp, the time is the clock at the read.
//
// One goroutine reads at a time (net.Conn's contract for reads), and
// received is only read by a reader, or after one has handed over.
type Conn struct {
	net.Conn
	// received is the arrival time, on the monotonic clock, of the
	// latest read that returned bytes; zero before the first.
	Received time.Time
	// kernel reads through recvmsg with receive timestamps; nil reads
	// the plain way and stamps with the clock at the read.
	kernel *kernelReader
	// peek is the pool's liveness peek (Alive), made at its first use.
	peek *peeker
	// hold, when set (tests only), runs before each read: a reader that
	// runs late, as under a CPU limit.
	Hold func()
	// sender writes to a socket raw and sees a full send buffer (see
	// socketWriter); nil where c is no socket. Stalled is how long the
	// current response's writes waited on the peer, and StallEnded when
	// the latest wait ended. Only the write in progress touches them: writes
	// come one at a time (under TLS, crypto/tls's own as well as the
	// writer's).
	sender     *socketWriter
	Stalled    time.Duration
	StallEnded time.Time
}

// Write writes p, through sender when there is one, adding the time it
// waited on the peer to stalled.
func (r *Conn) Write(p []byte) (int, error) {
	if r.sender == nil {
		return r.Conn.Write(p)
	}
	n, waited, err := r.sender.write(p)
	if waited > 0 {
		r.Stalled += waited
		r.StallEnded = time.Now()
	}
	return n, err
}

// SeeStalls calls onBlock when a write first waits on the peer (for a
// client's connection, on Unix sockets). onBlock is bound once, so a
// write allocates nothing.
func (r *Conn) SeeStalls(onBlock func()) {
	if r.sender != nil {
		r.sender.onBlock = onBlock
	}
}

// New wraps c; with kernel, it asks the kernel to stamp what c
// receives, and falls back to the clock at the read if it cannot.
func New(c net.Conn, kernel bool) *Conn {
	rc := &Conn{Conn: c, sender: newSocketWriter(c)}
	if kernel {
		rc.kernel = newKernelReader(c)
	}
	return rc
}

func (c *Conn) Read(p []byte) (int, error) {
	if c.Hold != nil {
		// A late reader does not make the request late: it goes first.
		if held := c.takeHeld(); held != nil {
			if _, err := c.Write(held); err != nil {
				return 0, err
			}
		}
		c.Hold()
	}
	if c.kernel != nil {
		n, at, err := c.kernel.read(p)
		if errors.Is(err, errHeldShort) {
			// The socket had no room for the whole held request: the rest
			// goes the ordinary way, waiting for room, then the read.
			if _, err := c.Write(c.kernel.takeHeld()); err != nil {
				return 0, err
			}
			n, at, err = c.kernel.read(p)
		}
		if n > 0 {
			c.Received = at
		}
		if !errors.Is(err, errNoKernelRead) {
			return n, err
		}
		// The socket cannot be read that way after all: plain reads
		// from now on, after a request still held.
		held := c.takeHeld()
		c.kernel = nil
		if held != nil {
			if _, err := c.Write(held); err != nil {
				return 0, err
			}
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.Received = time.Now()
	}
	return n, err
}

// SendWithNextRead holds p, a whole request, for the next Read to write
// from inside its wait on the poller, and tells whether it does; where it
// cannot (no receive-stamped reads), the caller writes p itself. Written
// there, after the poller's readiness was reset for the read, the request
// is followed by a wait for its answer with no read tried first: the
// answer cannot come before the request, and the read that would find
// nothing (EAGAIN) is a system call per request. p must stay as it is
// until that Read returns.
func (c *Conn) SendWithNextRead(p []byte) bool {
	if c.kernel == nil || len(p) == 0 {
		return false
	}
	c.kernel.held = p
	return true
}

// DropHeld lets go of a request held for a read that did not come.
func (c *Conn) DropHeld() { c.takeHeld() }

func (c *Conn) takeHeld() []byte {
	if c.kernel == nil {
		return nil
	}
	return c.kernel.takeHeld()
}

// errHeldShort: the socket took only part of a held request at once.
var errHeldShort = errors.New("the socket had no room for the whole held request")

// SyscallConn reaches the socket (the pool's liveness peek uses it).
func (c *Conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("not a socket")
	}
	return sc.SyscallConn()
}

// CloseWrite half-closes a TCP connection (the lingering close uses it).
func (c *Conn) CloseWrite() error {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !ok {
		return errors.New("cannot half-close")
	}
	return cw.CloseWrite()
}

// errNoKernelRead: the receive-stamped read cannot be used on this
// connection; read it the plain way.
var errNoKernelRead = errors.New("no receive-stamped read on this connection")

// fromKernel converts a kernel receive stamp (wall clock) to the monotonic
// clock of the marks. The wall clock is read with the monotonic one, at the
// read, so a wall-clock step moves a mark only by the step taken while its
// bytes waited in the socket; a stamp that reads as later than now (a step
// back) is taken as now.
//
// time.Now reads the wall clock, then the monotonic one: a thread
// preempted between the two gives a reading whose monotonic part is late by
// the preemption, and every mark converted with it too. Of two readings the
// one with the smaller gap is taken: the gaps differ by the monotonic
// interval minus the wall interval between them.
func fromKernel(sec, nsec int64) time.Time {
	a, b := time.Now(), time.Now()
	now := b
	if b.Sub(a) > b.Round(0).Sub(a.Round(0)) { // b's gap is the larger
		now = a
	}
	age := now.Round(0).Sub(time.Unix(sec, nsec)) // wall against wall
	if age < 0 {
		age = 0
	}
	return now.Add(-age) // keeps now's monotonic reading
}

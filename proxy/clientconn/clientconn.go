package clientconn

import (
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/netclock"
	"github.com/valyala/fasthttp"
)

// Listener wraps accepted connections in Conn, their reads
// stamped with the arrival of what they return (netclock.Conn).
type Listener struct {
	net.Listener
	// KernelStamps: mark what clients send with the kernel's receive
	// time where it gives one.
	KernelStamps bool
	// WriteTimeout bounds each write to a client (--client-write-timeout).
	WriteTimeout time.Duration
	// TLS serves HTTPS, when set.
	TLS *tls.Config
	// Tests only: Hold runs before each read; Blocked runs when a write
	// to the socket first waits on the client, on that write's goroutine
	// (the writer's, or under TLS one writing a record of crypto/tls's
	// own: see Conn); SendBuffer is SO_SNDBUF for each connection, so it
	// fills soon.
	Hold, Blocked func()
	SendBuffer    int
}

func (l Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*net.TCPConn); ok && l.SendBuffer > 0 {
		tc.SetWriteBuffer(l.SendBuffer) //nolint:errcheck // tests only
	}
	recv := netclock.New(c, l.KernelStamps)
	recv.Hold = l.Hold
	cc := &Conn{recv: recv, writeTimeout: l.WriteTimeout, testBlocked: l.Blocked}
	sock := &socket{Conn: recv, c: cc}
	cc.Conn = sock
	recv.SeeStalls(cc.blocked) // bound once: a write allocates nothing
	if l.TLS != nil {
		// TLS above the stamped, stall-seeing TCP connection: the marks
		// and the waits are the socket's, the bytes the client's.
		cc.Conn = tls.Server(sock, l.TLS)
	}
	return cc, nil
}

// socket is what Conn, or TLS above it, writes to: the client's stamped
// TCP connection, each write's wait on the client counted for the current
// response. Writes to it come one at a time (the writer's, or under
// crypto/tls's lock on its output), so recv's own count of waits is only
// touched by the write in progress.
type socket struct {
	*netclock.Conn
	c *Conn
}

func (s *socket) Write(p []byte) (int, error) {
	before := s.Conn.Stalled
	n, err := s.Conn.Write(p)
	if waited := s.Conn.Stalled - before; waited > 0 {
		s.c.waited(waited, s.Conn.StallEnded)
	}
	return n, err
}

// Conn notices a client that goes away while nothing is being written
// to it: while the engine is queued or in a long prefill there is no write
// to fail, and without this the engine would compute for nobody.
//
// While a request is watched, one goroutine reads ahead on the connection.
// The read blocks until the client sends more (a pipelined request) or
// closes. A close ends the watched request; bytes are kept and handed to
// the server's next Read, so nothing of a next request is lost. The
// server's own reads wait for a read-ahead in progress, so there is only
// ever one reader. A client that half-closes its sending side looks gone:
// HTTP/1.1 clients do not do that while awaiting a response.
//
// Under TLS that read writes too: crypto/tls answers a client's key update,
// or sends an alert for a bad record, from within Read, and sends its
// close_notify from within Close, which the server calls. So a write to
// the socket, and its wait on a client that does not read, can be another
// goroutine's than the writer's, between the writer's writes: what a wait
// runs (OnStall) and counts (Stalled) is kept under wmu for that.
//
// The read-ahead starts watchDelay after the request is forwarded, so a
// request answered sooner (a model list, a short completion) costs no
// goroutine, no extra read and no hand-over of the next request's bytes.
type Conn struct {
	net.Conn // recv
	recv     *netclock.Conn

	// lastRecv is the arrival of the bytes the server's latest read
	// returned, and free when the connection's previous request ended:
	// both only touched by the server's goroutine.
	lastRecv, free time.Time
	// writeTimeout bounds each write (--client-write-timeout), and
	// writeDeadlineSet is when the write deadline last moved: only the
	// writing goroutine touches it.
	writeTimeout     time.Duration
	writeDeadlineSet time.Time
	testBlocked      func() // Listener.Blocked

	// wmu guards what follows, and is never held across a write.
	wmu sync.Mutex
	// writing: the writer is inside Write (or ReadFrom's write).
	writing bool
	// socketWaits: a write to the socket, the writer's or TLS's own,
	// waits on the client now.
	socketWaits bool
	// onStall is OnStall's, for a response's duration.
	onStall func()
	// stalled is how long the current response's writes waited on the
	// client, and stallEnded when the latest wait ended.
	stalled    time.Duration
	stallEnded time.Time

	mu    sync.Mutex
	ahead chan struct{} // non-nil while a read-ahead runs; closed when it ends
	// buf takes what the read-ahead reads: usually the client's next
	// request whole, handed to the server without another read.
	buf     [1024]byte
	pending []byte // read ahead, not yet handed to the server
	// pendingRecv is the arrival of what was read ahead.
	pendingRecv time.Time
	err         error       // the connection failed or closed
	onGone      func()      // the watched request's abort
	start       *time.Timer // starts the read-ahead; made on first use
	// linger: the server answered an error and closes the connection
	// with the client's request maybe still arriving (see Close).
	linger atomic.Bool
	// closed, when set, runs once when the connection closes (under mu).
	closed func()
}

// Stalled is how long the current response's writes waited on the
// client (those TLS writes of its own included: the writer's next write
// waits behind them), and StallEnded when the latest wait ended.
func (c *Conn) Stalled() time.Duration {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.stalled
}

func (c *Conn) StallEnded() time.Time {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.stallEnded
}

// waited counts a write's wait on the client, which ended at end.
func (c *Conn) waited(d time.Duration, end time.Time) {
	c.wmu.Lock()
	c.stalled += d
	c.stallEnded = end
	c.socketWaits = false
	c.wmu.Unlock()
}

// OnStall sets what runs when a write to the client waits on it, for a
// response's duration (nil to clear). It runs only while the writer is
// inside Write, and Write does not return before it has, so it may touch
// what the writer owns as if it ran on the writer: it does, inside the
// write that waits, or as Write begins behind a record TLS writes of its
// own that waits; only when such a record starts waiting while the writer
// is already in Write, behind it, does it run on the goroutine that wrote
// the record, the writer held in Write meanwhile. It must not block.
func (c *Conn) OnStall(f func()) {
	c.wmu.Lock()
	c.onStall = f
	c.wmu.Unlock()
}

// OnClose sets what runs, once, when the connection closes: for a body
// written on the hijacked connection, which fasthttp may close without
// running the hijack.
func (c *Conn) OnClose(f func()) {
	c.mu.Lock()
	c.closed = f
	c.mu.Unlock()
}

// watchDelay is how long a watched request runs before the read-ahead
// starts: the most a client that leaves goes unnoticed beyond what it
// takes the read to return.
const watchDelay = 10 * time.Millisecond

// Watch calls onGone once if the client closes the connection before
// Unwatch is called.
func (c *Conn) Watch(onGone func()) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		onGone()
		return
	}
	defer c.mu.Unlock()
	c.onGone = onGone
	if c.ahead != nil {
		// A read-ahead from the previous request still runs: this one was
		// pipelined and read from the server's buffer. The server's read
		// deadline for it would end the watch early; a new deadline
		// reaches a blocked read too.
		c.Conn.SetReadDeadline(time.Time{}) //nolint:errcheck
		return
	}
	if c.start == nil {
		c.start = time.AfterFunc(watchDelay, c.startReadAhead)
	} else {
		c.start.Reset(watchDelay)
	}
}

// startReadAhead starts the read-ahead if a request is still watched.
func (c *Conn) startReadAhead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.onGone == nil || c.ahead != nil || len(c.pending) > 0 || c.err != nil {
		return
	}
	// The server's read deadline for this request has done its job; it
	// would otherwise end the watch early.
	c.Conn.SetReadDeadline(time.Time{}) //nolint:errcheck
	c.ahead = make(chan struct{})
	go c.readAhead(c.ahead)
}

// Unwatch ends the watch Watch began.
func (c *Conn) Unwatch() {
	c.mu.Lock()
	c.onGone = nil
	if c.start != nil {
		// If it fires anyway, startReadAhead finds nothing watched.
		c.start.Stop()
	}
	c.mu.Unlock()
}

func (c *Conn) readAhead(done chan struct{}) {
	n, err := c.Conn.Read(c.buf[:])
	var gone func()
	c.mu.Lock()
	if n > 0 {
		c.pending, c.pendingRecv = c.buf[:n], c.recv.Received
	}
	// A timeout comes from a deadline the server set for its next read
	// after the response; its own read will meet the same deadline.
	if ne, ok := err.(net.Error); err != nil && !(ok && ne.Timeout()) {
		c.err = err
		gone, c.onGone = c.onGone, nil
	}
	c.ahead = nil
	close(done)
	c.mu.Unlock()
	if gone != nil {
		gone()
	}
}

func (c *Conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if ahead := c.ahead; ahead != nil {
		c.mu.Unlock()
		<-ahead
		c.mu.Lock()
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		c.lastRecv = c.pendingRecv
		c.mu.Unlock()
		return n, nil
	}
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.lastRecv = c.recv.Received
	}
	return n, err
}

// Arrival is when the request the server has just read had arrived: the
// receive time of the read that completed it. A request pipelined behind
// another cannot be served before that one ends, so its arrival is then.
// Called by the server's goroutine, in the handler.
func (c *Conn) Arrival() time.Time {
	if c.lastRecv.IsZero() {
		return time.Now()
	}
	if c.lastRecv.Before(c.free) {
		return c.free
	}
	return c.lastRecv
}

// Ended records that the connection's current request has ended (its
// response is written, or failed), at now. Called by the server's
// goroutine.
func (c *Conn) Ended(now time.Time) { c.free = now }

// Write writes to the client within the write timeout. Moving a deadline
// costs a runtime timer update, so on a stream of events it moves only once
// an eighth of the timeout has passed: a write that cannot complete fails
// after between 1 and 1⅛ times the timeout.
func (c *Conn) Write(p []byte) (int, error) { return c.write(p) }

// write is one of the writer's writes. Leaving it waits for a stall hook
// in progress; entering it runs the hook if a write of TLS's own waits on
// the client now, as this one then waits behind it.
func (c *Conn) write(p []byte) (int, error) {
	defer c.leaveWrite()
	c.enterWrite()
	c.extendWriteDeadline()
	return c.Conn.Write(p)
}

func (c *Conn) enterWrite() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writing = true
	if c.socketWaits && c.onStall != nil {
		c.onStall()
	}
}

func (c *Conn) leaveWrite() {
	c.wmu.Lock()
	c.writing = false
	c.wmu.Unlock()
}

// blocked runs when a write first finds the client's socket full, on the
// goroutine of that write (see OnStall).
func (c *Conn) blocked() {
	c.sawWait()
	if c.testBlocked != nil {
		c.testBlocked()
	}
}

func (c *Conn) sawWait() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.socketWaits = true
	if c.writing && c.onStall != nil {
		c.onStall()
	}
}

func (c *Conn) extendWriteDeadline() {
	d := c.writeTimeout
	if d <= 0 {
		return
	}
	now := time.Now()
	if now.Sub(c.writeDeadlineSet) > d/8 {
		c.writeDeadlineSet = now
		c.Conn.SetWriteDeadline(now.Add(d + d/8)) //nolint:errcheck // a closed conn fails the write
	}
}

// NewResponse starts a response's writes: the server clears the write
// deadline for each request, so the next write sets it again.
func (c *Conn) NewResponse() {
	c.writeDeadlineSet = time.Time{}
	c.wmu.Lock()
	c.stalled, c.stallEnded = 0, time.Time{}
	c.wmu.Unlock()
}

// ReadFrom writes what r returns to the client as each read returns, with
// no buffer between. fasthttp's response writer hands a body of known
// length to it once the headers are flushed (see relayBody), so an engine
// that stops short cannot leave bytes it sent in a buffer that is then
// dropped with the connection.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	var written int64
	for {
		n, err := r.Read(*bp)
		if n > 0 {
			m, werr := c.write((*bp)[:n])
			written += int64(m)
			if werr != nil {
				return written, werr
			}
		}
		if err == io.EOF {
			return written, nil
		}
		if err != nil {
			return written, err
		}
	}
}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// Lingering close, as nginx's lingering_close: after an error answered
// before the client finished sending (a body over the limit), the
// connection's reading side stays open, its input discarded, until the
// client is done, silent for lingerTimeout, or lingerTime has passed. A
// client that writes its whole request before reading (Python's
// http.client, Go's net/http) then reads the 413 instead of a reset: a
// close with unread input makes the kernel answer the client's next
// segment with a reset, which discards the response it has not read yet.
const (
	lingerTime    = 10 * time.Second
	lingerTimeout = 2 * time.Second
	// maxLingering bounds the connections lingering at once; past it a
	// connection is closed at once, as before lingering existed, so a
	// flood of over-limit requests cannot pile up readers.
	maxLingering = 256
)

// lingering counts the connections lingering now.
var lingering atomic.Int32

// CloseAfterError ends the connection once the error response is written,
// with a lingering close.
func CloseAfterError(ctx *fasthttp.RequestCtx) {
	ctx.SetConnectionClose()
	if c, ok := ctx.Conn().(*Conn); ok {
		c.linger.Store(true)
	}
}

// Close closes the connection; after CloseAfterError it sends the FIN at
// once (the response is written) and discards input in the background
// before closing.
func (c *Conn) Close() error {
	c.mu.Lock()
	closed := c.closed
	c.closed = nil
	c.mu.Unlock()
	if closed != nil {
		defer closed()
	}
	_, tcp := c.recv.Conn.(*net.TCPConn)
	if !c.linger.CompareAndSwap(true, false) || !tcp {
		return c.Conn.Close()
	}
	if lingering.Add(1) > maxLingering || c.recv.CloseWrite() != nil {
		lingering.Add(-1)
		return c.Conn.Close()
	}
	go discardAndClose(c.recv)
	return nil
}

func discardAndClose(c net.Conn) {
	defer lingering.Add(-1)
	defer c.Close()
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	end := time.Now().Add(lingerTime)
	for {
		deadline := time.Now().Add(lingerTimeout)
		if deadline.After(end) {
			deadline = end
		}
		c.SetReadDeadline(deadline) //nolint:errcheck // a failed read ends it
		if _, err := c.Read(buf); err != nil {
			return
		}
	}
}

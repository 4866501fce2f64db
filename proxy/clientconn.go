package proxy

import (
	"net"
	"sync"
	"time"
)

// clientListener wraps accepted connections in clientConn.
type clientListener struct{ net.Listener }

func (l clientListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &clientConn{Conn: c}, nil
}

// clientConn notices a client that goes away while nothing is being written
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
// The read-ahead starts watchDelay after the request is forwarded, so a
// request answered sooner (a model list, a short completion) costs no
// goroutine, no extra read and no hand-over of the next request's bytes.
type clientConn struct {
	net.Conn

	mu    sync.Mutex
	ahead chan struct{} // non-nil while a read-ahead runs; closed when it ends
	// buf takes what the read-ahead reads: usually the client's next
	// request whole, handed to the server without another read.
	buf     [1024]byte
	pending []byte      // read ahead, not yet handed to the server
	err     error       // the connection failed or closed
	onGone  func()      // the watched request's abort
	start   *time.Timer // starts the read-ahead; made on first use
}

// watchDelay is how long a watched request runs before the read-ahead
// starts: the most a client that leaves goes unnoticed beyond what it
// takes the read to return.
const watchDelay = 10 * time.Millisecond

// watch calls onGone once if the client closes the connection before
// unwatch is called.
func (c *clientConn) watch(onGone func()) {
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
func (c *clientConn) startReadAhead() {
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

func (c *clientConn) unwatch() {
	c.mu.Lock()
	c.onGone = nil
	if c.start != nil {
		// If it fires anyway, startReadAhead finds nothing watched.
		c.start.Stop()
	}
	c.mu.Unlock()
}

func (c *clientConn) readAhead(done chan struct{}) {
	n, err := c.Conn.Read(c.buf[:])
	var gone func()
	c.mu.Lock()
	if n > 0 {
		c.pending = c.buf[:n]
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

func (c *clientConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if ahead := c.ahead; ahead != nil {
		c.mu.Unlock()
		<-ahead
		c.mu.Lock()
	}
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		c.mu.Unlock()
		return n, nil
	}
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return c.Conn.Read(p)
}

package upstream

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/framing"
	"github.com/timing-sidecar/timing-sidecar/proxy/netclock"
)

// maxIdleConns bounds the pooled idle connections to the engine:
// more than the in-flight requests an engine serves at once, so a burst's
// connections are reused; each holds a response-header buffer.
const maxIdleConns = 256

// Client is a small HTTP/1.1 client for the engine with a pool of
// keep-alive connections. It is not fasthttp.HostClient because the sidecar
// must be able to abort any one request at any moment, also while it waits
// for response headers, by closing that request's connection: this is how
// the engine learns that the client left. fasthttp's own request and
// response types still do the HTTP encoding and parsing.
type Client struct {
	addr   Addr
	dialer net.Dialer
	// TLS is the https engine's client configuration; nil for http.
	// Set before the first request.
	TLS           *tls.Config
	headerTimeout time.Duration
	idleTimeout   time.Duration
	keepAlive     time.Duration
	maxIdle       int
	maxHeader     int
	// kernelStamps: marks take the kernel's receive time of the engine's
	// bytes (netclock.Conn).
	kernelStamps bool
	// Hold, when set (tests only, before the first request), runs before
	// each read from the engine: a reader that runs late.
	Hold func()

	mu   sync.Mutex
	idle []*upstreamConn // most recently used last

	// writers hold the request writers: a request is written whole at
	// once, so an open stream needs none and a conn borrows one per send.
	writers sync.Pool // of *bufio.Writer
}

// Config is the engine client's settings (the --upstream-* flags).
type Config struct {
	// URL is the engine's scheme, host and port (see ParseURL).
	URL string
	// ConnectTimeout bounds a dial and a TLS handshake; HeaderTimeout the
	// wait for response headers; IdleTimeout a silence in a response
	// body; KeepAlive how long an idle connection is kept.
	ConnectTimeout, HeaderTimeout, IdleTimeout, KeepAlive time.Duration
	// MaxHeaderSize bounds a response's header block.
	MaxHeaderSize int
	// KernelStamps: mark the engine's bytes with the kernel's receive
	// time where it gives one.
	KernelStamps bool
	// CAFile verifies an https engine's certificate (the system's roots
	// otherwise); ServerName is the name verified, when not the URL's.
	CAFile, ServerName string
}

// New is a client for the engine cfg names.
func New(cfg Config) (*Client, error) {
	addr, err := ParseURL(cfg.URL)
	if err != nil {
		return nil, err
	}
	u := &Client{
		addr:          addr,
		dialer:        net.Dialer{Timeout: cfg.ConnectTimeout},
		headerTimeout: cfg.HeaderTimeout,
		idleTimeout:   cfg.IdleTimeout,
		keepAlive:     cfg.KeepAlive,
		maxIdle:       maxIdleConns,
		maxHeader:     cfg.MaxHeaderSize,
		kernelStamps:  cfg.KernelStamps && netclock.KernelTimestamps(),
	}
	u.writers.New = func() any { return bufio.NewWriterSize(nil, 4<<10) }
	if addr.TLS {
		host, _, _ := net.SplitHostPort(addr.Host)
		u.TLS = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
		if cfg.ServerName != "" {
			u.TLS.ServerName = cfg.ServerName
		}
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return nil, fmt.Errorf("upstream CA file: %w", err)
			}
			roots := x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("upstream CA file %s: no PEM certificate in it", cfg.CAFile)
			}
			u.TLS.RootCAs = roots
		}
	}
	return u, nil
}

// BaseURL is the engine's scheme and host, without a trailing slash.
func (u *Client) BaseURL() string {
	if u.addr.TLS {
		return "https://" + u.addr.Host
	}
	return "http://" + u.addr.Host
}

// Host is the engine's host:port.
func (u *Client) Host() string { return u.addr.Host }

// KernelStamps tells whether the engine's bytes are marked with the
// kernel's receive time.
func (u *Client) KernelStamps() bool { return u.kernelStamps }

// upstreamConn is one connection to the engine with its buffers.
type upstreamConn struct {
	net.Conn // recv, or TLS over it
	// recv is the TCP connection, which knows when the bytes of its
	// latest read arrived.
	recv      *netclock.Conn
	br        *bufio.Reader
	idleSince time.Time
	reused    bool
	nread     int // bytes read since the current request was written
	// sink takes the request being written (Exchange.write).
	sink requestSink
}

func (c *upstreamConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.nread += n
	return n, err
}

// get returns the most recently used pooled connection that is still open,
// or a new one.
func (u *Client) get() (*upstreamConn, error) {
	for {
		u.mu.Lock()
		u.reapLocked(time.Now())
		if len(u.idle) == 0 {
			u.mu.Unlock()
			return u.dial()
		}
		c := u.idle[len(u.idle)-1]
		u.idle = u.idle[:len(u.idle)-1]
		u.mu.Unlock()
		// Every reuse is checked, however short the idleness: beside a
		// close, the peek finds bytes an engine sent after a complete
		// response (a wrong Content-Length), which would otherwise be read
		// as the next client's response. One non-blocking syscall.
		if c.recv.Alive() {
			c.reused = true
			return c, nil
		}
		c.Close()
	}
}

// reapLocked closes pooled connections idle for longer than the keep-alive.
// The pool is ordered by idleSince, oldest first.
func (u *Client) reapLocked(now time.Time) {
	n := 0
	for n < len(u.idle) && now.Sub(u.idle[n].idleSince) >= u.keepAlive {
		u.idle[n].Close()
		n++
	}
	if n > 0 {
		u.idle = append(u.idle[:0], u.idle[n:]...)
	}
}

func (u *Client) dial() (*upstreamConn, error) {
	tcp, err := u.dialer.Dial("tcp", u.addr.Host)
	if err != nil {
		return nil, err
	}
	// TLS reads its records from the stamped connection, so a mark is
	// the arrival of the record that completed it.
	recv := netclock.New(tcp, u.kernelStamps)
	recv.Hold = u.Hold
	var nc net.Conn = recv
	if u.TLS != nil {
		tc := tls.Client(nc, u.TLS)
		ctx, cancel := context.WithTimeout(context.Background(), u.dialer.Timeout)
		err = tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			nc.Close()
			return nil, err
		}
		nc = tc
	}
	// Each open stream holds its reader, which must hold the engine's
	// whole response header block; larger bodies just take more reads.
	c := &upstreamConn{Conn: nc, recv: recv}
	c.br = bufio.NewReaderSize(c, u.maxHeader)
	return c, nil
}

// put returns a connection whose last response was read to its end.
func (u *Client) put(c *upstreamConn) {
	c.idleSince = time.Now()
	u.mu.Lock()
	u.reapLocked(c.idleSince)
	if len(u.idle) < u.maxIdle {
		u.idle = append(u.idle, c)
		c = nil
	}
	u.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// CloseIdle closes every pooled connection.
func (u *Client) CloseIdle() {
	u.mu.Lock()
	idle := u.idle
	u.idle = nil
	u.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
}

// ErrAborted is returned by an Exchange that was aborted because its client
// went away.
var ErrAborted = errors.New("client went away")

// ErrBadStatus is returned for a status line that is no final HTTP status.
var ErrBadStatus = errors.New("the engine's status is not a final HTTP status")

// ErrBadHeaders is returned for a response header block that parsers
// could read in more than one way.
var ErrBadHeaders = errors.New("the engine's response headers are malformed")

// peekHead returns the response head at the reader's start without
// consuming it: its header fields, after the status line and before the
// blank line, and the head's whole length through that blank line; nil if
// the head does not arrive whole (a timeout, a close, more than the buffer
// holds), which reading the response then reports.
func peekHead(br *bufio.Reader) (fields []byte, size int) {
	for {
		// Everything buffered, and then one byte more than that: a
		// response that arrived whole must be found in what is here, not
		// waited past.
		b, _ := br.Peek(br.Buffered())
		if end := blankLine(b); end >= 0 {
			size = end + 2 // the line end before the blank line, and a bare LF
			if b[end+1] == '\r' {
				size++
			}
			if line := bytes.IndexByte(b, '\n'); line < end {
				return b[line+1 : end+1], size
			}
			return b[:0], size // a status line and no fields
		}
		if _, err := br.Peek(len(b) + 1); err != nil {
			return nil, 0
		}
	}
}

// peekStatus reads the status code of the status line at the reader's
// start without consuming it: 0 when a status line's bytes do not arrive
// (reading the response then reports why), ErrBadStatus when the line is
// no "HTTP/1.x DDD" with a code of 100 to 599. fasthttp reads a status of
// 000 as 200, and is lenient with the line's spaces.
func peekStatus(br *bufio.Reader) (int, error) {
	line, err := br.Peek(len("HTTP/1.1 200\n"))
	if err != nil {
		return 0, nil
	}
	if !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' || !isDigit(line[9]) || !isDigit(line[10]) || !isDigit(line[11]) ||
		(line[12] != ' ' && line[12] != '\r' && line[12] != '\n') {
		return 0, ErrBadStatus
	}
	code := int(line[9]-'0')*100 + int(line[10]-'0')*10 + int(line[11]-'0')
	if code < 100 || code > 599 {
		return 0, ErrBadStatus
	}
	return code, nil
}

// skipBlankLines discards the empty lines an engine may send before a
// status line, as fasthttp's own reader does. It waits for the first byte,
// as reading the status line would.
func skipBlankLines(br *bufio.Reader) {
	for {
		b, err := br.Peek(1)
		if err != nil || (b[0] != '\r' && b[0] != '\n') {
			return
		}
		br.Discard(1) //nolint:errcheck // peeked
	}
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// blankLine is where the line end before the first empty line is, CRLF or
// a bare LF (which fasthttp accepts too), or -1.
func blankLine(b []byte) int {
	for i := bytes.IndexByte(b, '\n'); i >= 0 && i+1 < len(b); {
		switch {
		case b[i+1] == '\n', b[i+1] == '\r' && i+2 < len(b) && b[i+2] == '\n':
			return i
		}
		j := bytes.IndexByte(b[i+1:], '\n')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return -1
}

// ErrHeaderTimeout is returned when the engine sent no response headers
// within the configured time.
var ErrHeaderTimeout = errors.New("no response headers from upstream in time")

// Exchange is one request and its response on one connection to the
// engine. Abort may be called from any goroutine at any time.
type Exchange struct {
	up     *Client
	client Watcher // watched for the client leaving; may be nil
	out    Body    // the request's body
	// watcher, when set, is watched for the client leaving once the body
	// is sent: a body streamed through is read from it until then.
	watcher Watcher

	mu      sync.Mutex
	conn    *upstreamConn
	aborted bool

	// deadlineSet is when the body's read deadline last moved; only the
	// body's reader uses it.
	deadlineSet time.Time
	// headersRead is when the engine's response headers had arrived:
	// the request's accepted mark.
	headersRead time.Time
	// Recv is the connection the response is read from, for the arrival
	// time of the bytes read last; set with the headers and only used by
	// the response's reader.
	Recv *netclock.Conn
	// early: the engine answered before it took the whole request, so
	// its connection is not reused.
	early bool
	// body is the response body's reader (Body).
	body idleReader
}

// Watcher watches a client's connection for the client leaving while
// its request is with the engine, and aborts the exchange if it does.
type Watcher interface {
	Watch(abort func())
	Unwatch()
}

// Body is a request's body for the engine: an edited body, sent with its
// length (and again on a new connection, if the first was closed under
// it), or, with Stream set, a client's body streamed through unread, sent
// once.
type Body struct {
	Edit   Edited
	Stream Stream
	Size   int // Stream's length; -1 if unknown
}

// Edited is an edited body (rewrite.Edit): its size, and a reader from its
// start each time it is sent.
type Edited interface {
	Len() int
	Reader() io.Reader
}

// Stream is a client's body streamed through; Err is the error that cut
// it, which is the client's, not the engine's.
type Stream interface {
	io.Reader
	Err() error
}

// NewExchange starts an exchange that sends body, watching client for
// its leaving: once the body is sent when afterBody (a body streamed
// through is read from the client until then), else from the start.
// client may be nil.
func (u *Client) NewExchange(body Body, client Watcher, afterBody bool) *Exchange {
	x := &Exchange{up: u, out: body}
	switch {
	case client == nil:
	case afterBody:
		x.watcher = client
	default:
		client.Watch(x.Abort)
		x.client = client
	}
	return x
}

// HeadersRead is when the engine's response headers had arrived.
func (x *Exchange) HeadersRead() time.Time { return x.headersRead }

// Early tells an engine that answered before it took the whole request.
func (x *Exchange) Early() bool { return x.early }

// abort closes the Exchange's connection, so a blocked write or read returns
// at once and the engine sees its client go away.
func (x *Exchange) Abort() {
	x.mu.Lock()
	x.aborted = true
	c := x.conn
	x.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

func (x *Exchange) attach(c *upstreamConn) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.aborted {
		return false
	}
	x.conn = c
	return true
}

// release ends the Exchange: the connection goes back to the pool when the
// response was read to its end and both sides allow keep-alive; otherwise
// it is closed.
func (x *Exchange) release(reusable bool) {
	x.mu.Lock()
	c := x.conn
	x.conn = nil
	reusable = reusable && !x.aborted
	x.mu.Unlock()
	if c == nil {
		return
	}
	if c.br.Buffered() > 0 {
		// Bytes past the end of the response: an engine that got its
		// framing wrong. They must not be read as the next client's
		// response.
		reusable = false
	}
	if reusable {
		x.up.put(c)
	} else {
		c.Close()
	}
}

// finish ends a response the client has been given: it stops watching
// the client, frees resp and releases the connection.
func (x *Exchange) Finish(resp *fasthttp.Response, readToEnd bool) {
	if x.client != nil {
		x.client.Unwatch()
	}
	reusable := readToEnd && !resp.ConnectionClose() && resp.Header.ContentLength() != -2 && !x.early
	resp.CloseBodyStream() //nolint:errcheck // only releases the stream
	fasthttp.ReleaseResponse(resp)
	x.release(reusable)
}

// roundTrip sends req and reads the response headers into resp; the body is
// then read from resp.BodyStream(), with the idle timeout applied to each
// read. A request that fails on a reused connection, with the connection
// closed before the engine sent a single byte, is sent once more on a new
// connection: the engine closed the idle connection as the request went
// out. (Pooled connections are checked before reuse, so this is a narrow
// race; an engine that did read the request aborts it when its connection
// closes, so it does not run twice.)
func (x *Exchange) RoundTrip(req *fasthttp.Request, resp *fasthttp.Response) error {
	for attempt := 0; ; attempt++ {
		get := x.up.get
		if attempt > 0 || x.out.Stream != nil {
			// A body streamed through cannot be sent twice: it goes on a
			// new connection, which no idle timeout of the engine's has
			// closed.
			get = x.up.dial
		}
		c, err := get()
		if err != nil {
			return err
		}
		if !x.attach(c) {
			c.Close()
			return ErrAborted
		}
		err = x.send(c, req, resp)
		if err == nil {
			return nil
		}
		x.release(false)
		if x.IsAborted() {
			return ErrAborted
		}
		if attempt == 0 && c.reused && c.nread == 0 && IsConnGone(err) && x.out.Stream == nil {
			continue
		}
		return err
	}
}

func (x *Exchange) send(c *upstreamConn, req *fasthttp.Request, resp *fasthttp.Response) error {
	c.nread = 0
	var deadline time.Time
	if x.up.headerTimeout > 0 {
		deadline = time.Now().Add(x.up.headerTimeout)
	}
	c.SetDeadline(deadline) //nolint:errcheck // a closed conn fails the write below
	switch {
	case x.out.Stream != nil:
		req.SetBodyStream(x.out.Stream, x.out.Size)
	case x.out.Edit != nil && x.out.Edit.Len() > 0:
		req.SetBodyStream(x.out.Edit.Reader(), x.out.Edit.Len())
	}
	// A body streamed through goes as it comes, and a large one as it
	// is read: held, only a body already whole and small.
	hold := x.out.Stream == nil && (x.out.Edit == nil || x.out.Edit.Len() < maxHeldRequest)
	err := x.write(c, req, hold)
	// After the answer's head is read: a held request is sent by that read.
	defer c.recv.DropHeld()
	if err != nil {
		// An engine may answer before it has read the whole body (an
		// early 413 over its size limit, as llama.cpp's server does) and
		// close: the write fails, and its answer is what the client gets.
		// (Not when it was the client's body that failed.)
		if x.out.Stream != nil && x.out.Stream.Err() != nil {
			return err
		}
		c.SetDeadline(time.Now().Add(earlyAnswerWait)) //nolint:errcheck // a closed conn fails the read
		if x.readHead(c, resp) != nil {
			return err
		}
		x.early = true
		return nil
	}
	if x.watcher != nil {
		x.watcher.Watch(x.Abort)
		x.client, x.watcher = x.watcher, nil // unwatched as any
	}
	return x.readHead(c, resp)
}

// maxHeldRequest bounds a request held to be sent with the read of its
// answer (netclock.Conn.SendWithNextRead), kept in its connection's own
// buffer: a usual chat request fits, and an open stream holds no more than
// one request writer's buffer.
const maxHeldRequest = 4 << 10

// write writes req to c, or, with hold, holds it for c's next read: in
// the connection's own buffer, so the writer goes back to the pool at
// once and thousands of streams starting together share a few.
func (x *Exchange) write(c *upstreamConn, req *fasthttp.Request, hold bool) error {
	c.sink = requestSink{conn: c.Conn, held: c.sink.held[:0], through: !hold}
	bw := x.up.writers.Get().(*bufio.Writer)
	bw.Reset(&c.sink)
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	x.up.writers.Put(bw)
	if err != nil || c.sink.through || len(c.sink.held) == 0 {
		return err
	}
	if c.recv == c.Conn && c.recv.SendWithNextRead(c.sink.held) {
		return nil // not under TLS, whose records are its own to write
	}
	_, err = c.Conn.Write(c.sink.held)
	return err
}

// requestSink takes a request's bytes: held up to maxHeldRequest, then
// written through to conn.
type requestSink struct {
	conn    net.Conn
	held    []byte
	through bool
}

func (s *requestSink) Write(p []byte) (int, error) {
	if !s.through && len(s.held)+len(p) <= maxHeldRequest {
		s.held = append(s.held, p...)
		return len(p), nil
	}
	if !s.through {
		s.through = true
		if len(s.held) > 0 {
			if _, err := s.conn.Write(s.held); err != nil {
				return 0, err
			}
		}
	}
	return s.conn.Write(p)
}

// readHead reads the response's status and headers, every head checked
// as a request's is: the interim ones (1xx but 101) too, which it reads
// past itself, since fasthttp would read past them unchecked.
func (x *Exchange) readHead(c *upstreamConn, resp *fasthttp.Response) error {
	resp.StreamBody = true
	for {
		skipBlankLines(c.br)
		code, err := peekStatus(c.br)
		if err != nil {
			return err
		}
		fields, size := peekHead(c.br)
		if fields != nil && framing.Check(fields) != nil {
			return ErrBadHeaders
		}
		if fields == nil || code == 0 || code >= 200 || code == 101 {
			break
		}
		c.br.Discard(size) //nolint:errcheck // peeked: it is buffered
	}
	if err := resp.Read(c.br); err != nil {
		var ne net.Error
		if errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout()) {
			return ErrHeaderTimeout
		}
		return err
	}
	if code := resp.StatusCode(); code < 200 || code > 599 {
		// The sidecar asks for no upgrade (Upgrade is hop-by-hop), so 101
		// cannot be the answer, and nothing outside 100-599 is HTTP.
		return ErrBadStatus
	}
	// The read that completed the header block is the latest.
	x.headersRead, x.Recv = c.recv.Received, c.recv
	c.SetDeadline(time.Time{}) //nolint:errcheck // the body has its own idle timeout
	return nil
}

// awaitBytes waits up to d (at least a millisecond, so that bytes the
// kernel holds are seen) for the engine's next bytes, and tells whether
// any are there. It reads them into the connection's buffer, below the
// body's parser, whose state a timeout therefore never cuts.
func (x *Exchange) AwaitBytes(d time.Duration) bool {
	x.mu.Lock()
	c := x.conn
	x.mu.Unlock()
	if c == nil || c.br.Buffered() > 0 {
		return true
	}
	c.SetReadDeadline(time.Now().Add(max(d, time.Millisecond))) //nolint:errcheck // a closed conn fails the peek
	_, err := c.br.Peek(1)
	c.SetReadDeadline(time.Time{}) //nolint:errcheck
	x.deadlineSet = time.Time{}    // the idle timeout is set again at the next read
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}

// earlyAnswerWait bounds the wait for an engine's answer after writing
// the request to it failed: an early answer is already there.
const earlyAnswerWait = time.Second

// buffered is how many bytes of the response the connection has read
// past its headers.
func (x *Exchange) Buffered() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.conn == nil {
		return 0
	}
	return x.conn.br.Buffered()
}

// received is when the bytes of the latest read of the response arrived:
// the mark of whatever that read completed.
func (x *Exchange) Received() time.Time { return x.Recv.Received }

func (x *Exchange) IsAborted() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.aborted
}

// body returns a reader of the response body that enforces the idle
// timeout: a read that waits longer fails with a timeout error.
func (x *Exchange) Body(resp *fasthttp.Response) io.Reader {
	x.body = idleReader{x: x, r: resp.BodyStream()}
	return &x.body // the exchange's own: no reader made per response
}

type idleReader struct {
	x *Exchange
	r io.Reader
}

func (r idleReader) Read(p []byte) (int, error) {
	if d := r.x.up.idleTimeout; d > 0 {
		// Moving the deadline costs a runtime timer update; on a stream of
		// events every few ms that adds up, so it moves only once an
		// eighth of the timeout has passed, and a silence is cut after
		// between 1 and 1⅛ times the timeout.
		now := time.Now()
		if now.Sub(r.x.deadlineSet) > d/8 {
			r.x.deadlineSet = now
			r.x.mu.Lock()
			if c := r.x.conn; c != nil {
				c.SetReadDeadline(now.Add(d + d/8)) //nolint:errcheck
			}
			r.x.mu.Unlock()
		}
	}
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF && isTrailerError(err) {
		// The body's last chunk came; the trailer after it is dropped.
		// Its bytes stay unread, so the connection is not reused.
		err = io.EOF
	}
	return n, err
}

// isTrailerError tells an error of fasthttp's refusing the engine's
// trailer section, after the body's last chunk: a field RFC 9110 forbids
// in trailers (Content-Type, Set-Cookie, ...) or one it cannot parse. The
// body is whole, so this is its end, not a failure: the trailer is
// dropped, as a request's is. fasthttp has no sentinel for it; its
// messages name the trailer (TestEngineTrailersAreDropped pins them).
func isTrailerError(err error) bool {
	var ne net.Error
	return !errors.As(err, &ne) && !errors.Is(err, io.ErrUnexpectedEOF) && strings.Contains(err.Error(), "trailer")
}

// IsConnGone reports an error of a connection the peer had already closed.
func IsConnGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

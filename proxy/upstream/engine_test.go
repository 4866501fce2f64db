package upstream

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// engine is a scripted HTTP/1.1 engine on loopback: each connection it
// accepts is served by the test's script, in a goroutine of its own,
// which reads requests and writes exact bytes.
type engine struct {
	ln      net.Listener
	accepts atomic.Int32
	done    chan struct{} // closed when the test ends: scripts stop waiting
	wg      sync.WaitGroup
}

// engineConn is one accepted connection, as its script sees it.
type engineConn struct {
	net.Conn
	e  *engine
	br *bufio.Reader
	n  int // which accept this is, from 1
}

// got is a request as the engine read it.
type got struct {
	line    string // "POST /v1/completions HTTP/1.1"
	host    string
	header  http.Header
	length  int64 // Content-Length; -1 if none
	chunked bool
	body    string
}

func startEngine(t *testing.T, script func(c *engineConn)) *engine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{ln: ln, done: make(chan struct{})}
	e.wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			c := &engineConn{Conn: nc, e: e, br: bufio.NewReader(nc), n: int(e.accepts.Add(1))}
			e.wg.Go(func() {
				defer nc.Close()
				script(c)
			})
			e.wg.Go(func() {
				<-e.done // the test's end ends a script's wait on a read
				nc.Close()
			})
		}
	})
	t.Cleanup(func() {
		close(e.done)
		ln.Close()
		e.wg.Wait()
	})
	return e
}

// request reads the next request whole, body included; false if the
// connection ended first.
func (c *engineConn) request() (got, bool) {
	req, err := http.ReadRequest(c.br)
	if err != nil {
		return got{}, false
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return got{}, false
	}
	return got{
		line:    req.Method + " " + req.RequestURI + " " + req.Proto,
		host:    req.Host,
		header:  req.Header,
		length:  req.ContentLength,
		chunked: slices.Contains(req.TransferEncoding, "chunked"),
		body:    string(body),
	}, true
}

// send writes s as it is. A failed write is the client having gone,
// which each test checks in its own way.
func (c *engineConn) send(s string) {
	io.WriteString(c, s) //nolint:errcheck // see above
}

// awaitClose returns once the client has closed the connection (or the
// test ended), discarding what it sends meanwhile.
func (c *engineConn) awaitClose() {
	io.Copy(io.Discard, c.br) //nolint:errcheck // any end will do
}

// wait blocks until ch is closed; false if the test ended first.
func (c *engineConn) wait(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-c.e.done:
		return false
	}
}

// answerOK is the answer of an engine that serves a request normally; X-Conn
// says which connection served it.
func answerOK(c *engineConn) string {
	return "HTTP/1.1 200 OK\r\nX-Conn: " + strconv.Itoa(c.n) + "\r\nContent-Length: 2\r\n\r\nok"
}

// serveAll answers every request on every connection with answerOK.
func serveAll(c *engineConn) {
	for {
		if _, more := c.request(); !more {
			return
		}
		c.send(answerOK(c))
	}
}

// testConfig is a client's settings for a test: a header timeout that
// turns a hang into a failure, and a keep-alive no test outlasts.
func testConfig() Config {
	return Config{HeaderTimeout: time.Minute, KeepAlive: time.Hour, MaxHeaderSize: 4 << 10}
}

func newClient(t *testing.T, e *engine, cfg Config) *Client {
	t.Helper()
	cfg.URL = "http://" + e.ln.Addr().String()
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.CloseIdle)
	return u
}

// edited is an Edited body held in a string.
type edited string

func (e edited) Len() int          { return len(e) }
func (e edited) Reader() io.Reader { return strings.NewReader(string(e)) }

// stream is a client's body streamed through; err is what its Err says.
type stream struct {
	io.Reader
	err error
}

func (s *stream) Err() error { return s.err }

// roundTrip sends POST /v1/completions on x.
func roundTrip(x *Exchange) (*fasthttp.Response, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod("POST")
	req.SetRequestURI("/v1/completions")
	req.Header.SetHost("engine")
	req.UseHostHeader = true
	req.Header.SetContentType("application/json")
	resp := fasthttp.AcquireResponse()
	if err := x.RoundTrip(req, resp); err != nil {
		fasthttp.ReleaseResponse(resp)
		return nil, err
	}
	return resp, nil
}

// exchange sends body on a new exchange and reads the answer's headers.
func exchange(t *testing.T, u *Client, body Body) (*Exchange, *fasthttp.Response) {
	t.Helper()
	x := u.NewExchange(body, nil, false)
	resp, err := roundTrip(x)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	return x, resp
}

// readBody reads the answer's body to its end.
func readBody(t *testing.T, x *Exchange, resp *fasthttp.Response) string {
	t.Helper()
	if resp.BodyStream() == nil {
		return ""
	}
	b, err := io.ReadAll(x.Body(resp))
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

// served says which connection answered: answerOK's X-Conn.
func served(resp *fasthttp.Response) string { return string(resp.Header.Peek("X-Conn")) }

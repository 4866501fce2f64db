package upstream

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestConnectionReuse: a connection goes back to the pool, and serves the
// next exchange, only when its answer was read to the end and nothing
// says it ends; the engine keeps every connection open.
func TestConnectionReuse(t *testing.T) {
	tests := []struct {
		name      string
		answer    string // the first answer, on connection 1
		readToEnd bool   // the test reads the body and says so to Finish
		want      string // the connection that serves the next exchange
	}{
		{"read to the end: reused", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true, "1"},
		{"chunked, read to the end: reused", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", true, "1"},
		{"empty body: reused", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", true, "1"},
		{"not read to the end: closed", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false, "2"},
		{"Connection: close: closed", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", true, "2"},
		{"bytes past the body: closed", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok+stray", true, "2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startEngine(t, func(c *engineConn) {
				if c.n == 1 {
					if _, ok := c.request(); !ok {
						return
					}
					c.send(tt.answer)
				}
				serveAll(c)
			})
			u := newClient(t, e, testConfig())
			x, resp := exchange(t, u, Body{Edit: edited("hi")})
			if tt.readToEnd {
				readBody(t, x, resp)
			}
			x.Finish(resp, tt.readToEnd)
			x, resp = exchange(t, u, Body{Edit: edited("hi")})
			defer x.Finish(resp, true)
			if got := served(resp); got != tt.want {
				t.Fatalf("next exchange on connection %q, want %q", got, tt.want)
			}
		})
	}
}

// TestPooledConnectionsEnd: a pooled connection serves the next exchange
// within the keep-alive; past it, with no keep-alive, or after CloseIdle
// it is closed (the engine sees it end) and the next exchange dials.
func TestPooledConnectionsEnd(t *testing.T) {
	tests := []struct {
		name      string
		keepAlive time.Duration
		closeIdle bool
		want      string // the connection that serves the next exchange
	}{
		{name: "within the keep-alive: reused", keepAlive: time.Hour, want: "1"},
		{name: "past the keep-alive: closed", keepAlive: 10 * time.Millisecond, want: "2"},
		{name: "no keep-alive: never pooled", keepAlive: 0, want: "2"},
		{name: "CloseIdle: closed", keepAlive: time.Hour, closeIdle: true, want: "2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			firstEnded := make(chan struct{})
			e := startEngine(t, func(c *engineConn) {
				serveAll(c)
				if c.n == 1 {
					close(firstEnded)
				}
			})
			cfg := testConfig()
			cfg.KeepAlive = tt.keepAlive
			u := newClient(t, e, cfg)
			x, resp := exchange(t, u, Body{Edit: edited("hi")})
			readBody(t, x, resp)
			x.Finish(resp, true)
			if tt.closeIdle {
				u.CloseIdle()
			}
			if tt.keepAlive > 0 && tt.keepAlive < time.Minute {
				// Outlast the keep-alive: a lower bound, which a busy
				// machine only lengthens.
				time.Sleep(2 * tt.keepAlive)
			}
			x, resp = exchange(t, u, Body{Edit: edited("hi")})
			defer x.Finish(resp, true)
			if got := served(resp); got != tt.want {
				t.Fatalf("next exchange on connection %q, want %q", got, tt.want)
			}
			if tt.want != "1" {
				<-firstEnded
			}
		})
	}
}

// TestEngineClosedAnIdleConnection: a pooled connection the engine closed
// while it sat idle is not used; the exchange goes on a new one, and the
// engine reads the request once.
func TestEngineClosedAnIdleConnection(t *testing.T) {
	closed := make(chan struct{})
	var requests atomic.Int32
	e := startEngine(t, func(c *engineConn) {
		for {
			if _, ok := c.request(); !ok {
				return
			}
			requests.Add(1)
			c.send(answerOK(c))
			if c.n == 1 {
				c.Close() // an engine's idle close (uvicorn's after 5 s)
				close(closed)
				return
			}
		}
	})
	u := newClient(t, e, testConfig())
	x, resp := exchange(t, u, Body{Edit: edited("hi")})
	readBody(t, x, resp)
	x.Finish(resp, true)
	<-closed
	x, resp = exchange(t, u, Body{Edit: edited("hi")})
	defer x.Finish(resp, true)
	if served(resp) != "2" || requests.Load() != 2 {
		t.Fatalf("served by connection %q after %d requests; want 2, 2", served(resp), requests.Load())
	}
}

// TestAConnectionClosedUnderARequest: a pooled connection the engine
// closes before answering a byte is its idle close racing the request: an
// edited body is sent again on a new connection. Otherwise (part of an
// answer came, the connection was new, or the body streams through and
// cannot be read twice) the failure is the exchange's.
func TestAConnectionClosedUnderARequest(t *testing.T) {
	editedBody := func() Body { return Body{Edit: edited("hi")} }
	streamedBody := func() Body { return Body{Stream: &stream{Reader: strings.NewReader("hi")}, Size: 2} }
	tests := []struct {
		name      string
		pooled    bool // an earlier exchange leaves connection 1 in the pool
		body      func() Body
		reply     string // what the engine writes before it closes
		wantReads int    // how often the engine read the request
		wantConns int32  // connections dialed in all
		wantErr   bool
	}{
		{"pooled, closed before a byte: sent again", true, editedBody, "", 2, 2, false},
		{"pooled, closed after part of the answer: not sent again", true, editedBody, "HTTP/1.1 200 OK\r\nContent-", 1, 1, true},
		{"new, closed before a byte: not sent again", false, editedBody, "", 1, 1, true},
		{"streamed: on a new connection, not sent again", true, streamedBody, "", 1, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			first := int32(1) // the request the engine closes under
			if tt.pooled {
				first = 2
			}
			var n atomic.Int32
			reads := make(chan string, 4) // the bodies of the tested request
			e := startEngine(t, func(c *engineConn) {
				for {
					g, ok := c.request()
					if !ok {
						return
					}
					i := n.Add(1)
					if i >= first {
						reads <- g.body
					}
					if i == first {
						c.send(tt.reply)
						return
					}
					c.send(answerOK(c))
				}
			})
			u := newClient(t, e, testConfig())
			if tt.pooled {
				x, resp := exchange(t, u, Body{Edit: edited("hi")})
				readBody(t, x, resp)
				x.Finish(resp, true)
			}
			x := u.NewExchange(tt.body(), nil, false)
			resp, err := roundTrip(x)
			if err == nil {
				x.Finish(resp, true)
			}
			if (err != nil) != tt.wantErr || (err != nil && !IsConnGone(err)) {
				t.Fatalf("err = %v; want an error %v, the connection's", err, tt.wantErr)
			}
			if len(reads) != tt.wantReads || e.accepts.Load() != tt.wantConns {
				t.Fatalf("engine read the request %d times on %d connections; want %d on %d",
					len(reads), e.accepts.Load(), tt.wantReads, tt.wantConns)
			}
			for range tt.wantReads {
				if body := <-reads; body != "hi" {
					t.Fatalf("engine read body %q", body)
				}
			}
		})
	}
}

package upstream

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/netclock"
)

// TestRoundTrip: the engine reads the request as it was sent, its body
// framed as its kind says, and the final answer comes back as the engine
// wrote it.
func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name        string
		body        Body
		wantLength  int64 // the Content-Length the engine reads; -1 for none
		wantChunked bool
		wantBody    string
		answer      string // the engine's bytes; it closes after them
		wantStatus  int
		wantAnswer  string
	}{
		{
			name: "edited body, answer with a length", body: Body{Edit: edited(`{"prompt":"hi"}`)},
			wantLength: 15, wantBody: `{"prompt":"hi"}`,
			answer:     "HTTP/1.1 201 Created\r\nX-Engine: e\r\nContent-Length: 9\r\n\r\n{\"id\":1}\n",
			wantStatus: 201, wantAnswer: "{\"id\":1}\n",
		},
		{
			name: "streamed body of known size, chunked answer", body: Body{Stream: &stream{Reader: strings.NewReader("abcdef")}, Size: 6},
			wantLength: 6, wantBody: "abcdef",
			answer:     "HTTP/1.1 200 OK\r\nX-Engine: e\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n",
			wantStatus: 200, wantAnswer: "abcdef",
		},
		{
			name: "streamed body of unknown size, answer until close", body: Body{Stream: &stream{Reader: strings.NewReader("abcdef")}, Size: -1},
			wantLength: -1, wantChunked: true, wantBody: "abcdef",
			answer:     "HTTP/1.1 200 OK\r\nX-Engine: e\r\n\r\nuntil close",
			wantStatus: 200, wantAnswer: "until close",
		},
		{
			name: "empty edited body, answer without a body", body: Body{Edit: edited("")},
			answer:     "HTTP/1.1 204 No Content\r\nX-Engine: e\r\n\r\n",
			wantStatus: 204,
		},
		{
			name: "interim answers before the final one are read past", body: Body{Edit: edited("hi")},
			wantLength: 2, wantBody: "hi",
			answer: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n" +
				"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" +
				"HTTP/1.1 200 OK\r\nX-Engine: e\r\nContent-Length: 2\r\n\r\nok",
			wantStatus: 200, wantAnswer: "ok",
		},
		{
			name: "empty lines before the status line are read past", body: Body{Edit: edited("hi")},
			wantLength: 2, wantBody: "hi",
			answer:     "\r\n\nHTTP/1.1 200 OK\r\nX-Engine: e\r\nContent-Length: 2\r\n\r\nok",
			wantStatus: 200, wantAnswer: "ok",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotc := make(chan got, 1)
			e := startEngine(t, func(c *engineConn) {
				if g, ok := c.request(); ok {
					gotc <- g
					c.send(tt.answer)
				}
			})
			x, resp := exchange(t, newClient(t, e, testConfig()), tt.body)
			defer x.Finish(resp, true)
			g := <-gotc
			if g.line != "POST /v1/completions HTTP/1.1" || g.host != "engine" || g.header.Get("Content-Type") != "application/json" {
				t.Errorf("engine read %q, Host %q, Content-Type %q", g.line, g.host, g.header.Get("Content-Type"))
			}
			if g.length != tt.wantLength || g.chunked != tt.wantChunked || g.body != tt.wantBody {
				t.Errorf("engine read body %q (Content-Length %d, chunked %v), want %q (%d, %v)",
					g.body, g.length, g.chunked, tt.wantBody, tt.wantLength, tt.wantChunked)
			}
			if resp.StatusCode() != tt.wantStatus || string(resp.Header.Peek("X-Engine")) != "e" {
				t.Errorf("status %d, X-Engine %q; want %d, e", resp.StatusCode(), resp.Header.Peek("X-Engine"), tt.wantStatus)
			}
			if body := readBody(t, x, resp); body != tt.wantAnswer {
				t.Errorf("answer body %q, want %q", body, tt.wantAnswer)
			}
		})
	}
}

// TestRefusedResponses: a status that is no final HTTP status, or a header
// block parsers could read two ways, fails the exchange before any body
// is read, and its connection is closed, not pooled.
func TestRefusedResponses(t *testing.T) {
	tests := []struct {
		name, answer string
		want         error // nil: any error (fasthttp's own)
	}{
		{"status 000, which fasthttp reads as 200", "HTTP/1.1 000 OK\r\nContent-Length: 2\r\n\r\nok", ErrBadStatus},
		{"status below 100", "HTTP/1.1 099 Odd\r\nContent-Length: 2\r\n\r\nok", ErrBadStatus},
		{"status above 599", "HTTP/1.1 600 Odd\r\nContent-Length: 2\r\n\r\nok", ErrBadStatus},
		{"101 to a request that asked no upgrade", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", ErrBadStatus},
		{"no status line", "this is not HTTP at all\r\n\r\n", nil},
		{"Content-Length and Transfer-Encoding", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", ErrBadHeaders},
		{"two Content-Lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok", ErrBadHeaders},
		{"a field name with a space", "HTTP/1.1 200 OK\r\nBad Name: 1\r\nContent-Length: 2\r\n\r\nok", ErrBadHeaders},
		{"a folded field", "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 2\r\n\r\nok", ErrBadHeaders},
		{"Transfer-Encoding not ending in chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nok", ErrBadHeaders},
		{"a coding other than chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", ErrBadHeaders},
		{"two spaces before the status (RFC 9112 has one)", "HTTP/1.1  200 OK\r\nContent-Length: 2\r\n\r\nok", ErrBadStatus},
		{"status 000 with two spaces before it", "HTTP/1.1  000 OK\r\nContent-Length: 2\r\n\r\nok", ErrBadStatus},
		{"a status of four digits", "HTTP/1.1 2000 OK\r\nContent-Length: 2\r\n\r\nok", ErrBadStatus},
		// Interim answers are read past; the final one is checked as the first is.
		{"after a 100, Content-Length and Transfer-Encoding", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", ErrBadHeaders},
		{"after a 100, status 000", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 000 OK\r\nContent-Length: 2\r\n\r\nok", ErrBadStatus},
		{"after a 103, a field name with a space", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nBad Name: 1\r\nContent-Length: 2\r\n\r\nok", ErrBadHeaders},
		{"an interim answer's own fields", "HTTP/1.1 103 Early Hints\r\nBad Name: 1\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", ErrBadHeaders},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			closed := make(chan struct{})
			e := startEngine(t, func(c *engineConn) {
				defer close(closed)
				if _, ok := c.request(); ok {
					c.send(tt.answer)
					c.awaitClose()
				}
			})
			x := newClient(t, e, testConfig()).NewExchange(Body{Edit: edited("hi")}, nil, false)
			resp, err := roundTrip(x)
			if err == nil {
				x.Finish(resp, false)
				t.Fatalf("status %d accepted", resp.StatusCode())
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			<-closed
		})
	}
}

// TestHeaderTimeout: an engine that sends no whole header block within
// the configured time fails the exchange with a timeout, and its
// connection is closed. Only the error is checked, not how long it took.
func TestHeaderTimeout(t *testing.T) {
	for _, tt := range []struct{ name, sent string }{
		{"engine silent", ""},
		{"half a header block", "HTTP/1.1 200 OK\r\nContent-Le"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			closed := make(chan struct{})
			e := startEngine(t, func(c *engineConn) {
				defer close(closed)
				if _, ok := c.request(); ok {
					c.send(tt.sent)
					c.awaitClose()
				}
			})
			cfg := testConfig()
			cfg.HeaderTimeout = 50 * time.Millisecond
			_, err := roundTrip(newClient(t, e, cfg).NewExchange(Body{Edit: edited("hi")}, nil, false))
			if !errors.Is(err, ErrHeaderTimeout) {
				t.Fatalf("err = %v, want %v", err, ErrHeaderTimeout)
			}
			<-closed
		})
	}
}

// TestEarlyAnswer: an engine that answers before it has read the whole
// body (llama.cpp's 413 over its size limit) and closes: writing the rest
// fails, the answer is the exchange's, and Early says so.
func TestEarlyAnswer(t *testing.T) {
	const answer = "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 9\r\n\r\ntoo large"
	for _, kind := range []string{"edited", "streamed"} {
		t.Run(kind, func(t *testing.T) {
			answered := make(chan struct{})
			e := startEngine(t, func(c *engineConn) {
				if _, err := http.ReadRequest(c.br); err == nil { // the headers only
					c.send(answer)
					c.Close()
				}
				close(answered)
			})
			late := lateBody{open: answered}
			body := Body{Edit: late}
			if kind == "streamed" {
				body = Body{Stream: &stream{Reader: late.Reader()}, Size: late.Len()}
			}
			x, resp := exchange(t, newClient(t, e, testConfig()), body)
			defer x.Finish(resp, true)
			if got := readBody(t, x, resp); resp.StatusCode() != 413 || got != "too large" || !x.Early() {
				t.Fatalf("status %d, body %q, Early %v; want the 413, early", resp.StatusCode(), got, x.Early())
			}
		})
	}
}

// TestAClientsFailingStreamIsItsOwnError: a streamed body cut by the
// client fails the exchange with the client's error, even when the engine
// has answered meanwhile: that answer is no early one.
func TestAClientsFailingStreamIsItsOwnError(t *testing.T) {
	answered := make(chan struct{})
	e := startEngine(t, func(c *engineConn) {
		if _, err := http.ReadRequest(c.br); err == nil {
			c.send("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
			close(answered)
			c.awaitClose()
		}
	})
	cut := errors.New("client went quiet")
	// 8 KiB get the headers out; the client fails once the engine answered.
	body := &stream{Reader: io.MultiReader(strings.NewReader(strings.Repeat("x", 8<<10)), gate(answered), failing{cut}), err: cut}
	_, err := roundTrip(newClient(t, e, testConfig()).NewExchange(Body{Stream: body, Size: 16 << 10}, nil, false))
	if !errors.Is(err, cut) {
		t.Fatalf("err = %v, want the client's", err)
	}
}

// TestAbortWhileWaitingForHeaders: the client leaving, seen directly or
// by its Watcher, ends a RoundTrip that waits on a silent engine with
// ErrAborted, and the engine sees its connection closed. There is no
// header timeout: nothing but the abort can end the wait.
func TestAbortWhileWaitingForHeaders(t *testing.T) {
	for _, tt := range []struct {
		name             string
		watch, afterBody bool
	}{
		{name: "Abort called"},
		{name: "client watched from the start leaves", watch: true},
		{name: "client watched once the body is sent leaves", watch: true, afterBody: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			arrived, closed := make(chan struct{}), make(chan struct{})
			e := startEngine(t, func(c *engineConn) {
				defer close(closed)
				if _, ok := c.request(); ok {
					close(arrived)
					c.awaitClose()
				}
			})
			cfg := testConfig()
			cfg.HeaderTimeout = 0
			u := newClient(t, e, cfg)
			w := &watcher{watched: make(chan func(), 1)}
			var client Watcher
			if tt.watch {
				client = w
			}
			x := u.NewExchange(Body{Edit: edited("hi")}, client, tt.afterBody)
			errc := make(chan error, 1)
			go func() {
				_, err := roundTrip(x)
				errc <- err
			}()
			<-arrived
			abort := x.Abort
			if tt.watch {
				abort = <-w.watched
			}
			abort()
			if err := <-errc; !errors.Is(err, ErrAborted) || !x.IsAborted() {
				t.Fatalf("err = %v, IsAborted %v; want %v", err, x.IsAborted(), ErrAborted)
			}
			<-closed
		})
	}
}

// TestAbortBeforeTheRequest: an exchange aborted before its RoundTrip
// fails at once.
func TestAbortBeforeTheRequest(t *testing.T) {
	x := newClient(t, startEngine(t, serveAll), testConfig()).NewExchange(Body{Edit: edited("hi")}, nil, false)
	x.Abort()
	if _, err := roundTrip(x); !errors.Is(err, ErrAborted) {
		t.Fatalf("err = %v, want %v", err, ErrAborted)
	}
}

// TestFinishUnwatchesTheClient: the client is watched once, from the
// start or once the body is sent, and Finish stops watching it.
func TestFinishUnwatchesTheClient(t *testing.T) {
	for _, afterBody := range []bool{false, true} {
		t.Run(fmt.Sprint("afterBody=", afterBody), func(t *testing.T) {
			u := newClient(t, startEngine(t, serveAll), testConfig())
			w := &watcher{watched: make(chan func(), 2)}
			x := u.NewExchange(Body{Edit: edited("hi")}, w, afterBody)
			resp, err := roundTrip(x)
			if err != nil {
				t.Fatal(err)
			}
			readBody(t, x, resp)
			x.Finish(resp, true)
			if len(w.watched) != 1 || w.unwatched.Load() != 1 {
				t.Fatalf("watched %d times, unwatched %d; want once each", len(w.watched), w.unwatched.Load())
			}
		})
	}
}

// TestMarksFallBetweenSendAndRead: HeadersRead and Received are when the
// engine's bytes arrived: not before the engine wrote them, not after the
// test had them. Causal bounds only, never two clocks compared closely.
func TestMarksFallBetweenSendAndRead(t *testing.T) {
	for _, tt := range []struct {
		name   string
		kernel bool
	}{{"clock at the read", false}, {"kernel receive stamps", true}} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.kernel && !netclock.KernelTimestamps() {
				t.Skip("no kernel receive stamps here")
			}
			sent, more := make(chan time.Time, 2), make(chan struct{})
			e := startEngine(t, func(c *engineConn) {
				if _, ok := c.request(); !ok {
					return
				}
				sent <- time.Now()
				c.send("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
				if c.wait(more) {
					sent <- time.Now()
					c.send("body")
				}
			})
			cfg := testConfig()
			cfg.KernelStamps = tt.kernel
			x, resp := exchange(t, newClient(t, e, cfg), Body{Edit: edited("hi")})
			defer x.Finish(resp, true)
			between(t, "HeadersRead", <-sent, x.HeadersRead(), time.Now())
			close(more)
			if _, err := io.ReadFull(x.Body(resp), make([]byte, 4)); err != nil {
				t.Fatal(err)
			}
			between(t, "Received", <-sent, x.Received(), time.Now())
		})
	}
}

func between(t *testing.T, name string, wrote, mark, read time.Time) {
	t.Helper()
	if mark.Before(wrote) || mark.After(read) {
		t.Errorf("%s %v is outside [engine wrote %v, test read %v]", name, mark, wrote, read)
	}
}

// TestAwaitBytes: true at once for bytes buffered, false for an engine
// silent past d, true when bytes arrive within d; a false leaves the
// body's reading whole.
func TestAwaitBytes(t *testing.T) {
	more := make(chan struct{})
	e := startEngine(t, func(c *engineConn) {
		if _, ok := c.request(); ok {
			c.send("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nfirst")
			if c.wait(more) {
				c.send("-last")
			}
			c.awaitClose()
		}
	})
	x, resp := exchange(t, newClient(t, e, testConfig()), Body{Edit: edited("hi")})
	defer x.Finish(resp, true)
	body := x.Body(resp)
	if n := x.Buffered(); n != len("first") || !x.AwaitBytes(time.Millisecond) {
		t.Fatalf("with the headers: %d bytes buffered, want 5, and awaited", n)
	}
	if _, err := io.ReadFull(body, make([]byte, 5)); err != nil {
		t.Fatal(err)
	}
	if x.AwaitBytes(20 * time.Millisecond) {
		t.Fatal("bytes awaited from a silent engine")
	}
	close(more)
	if !x.AwaitBytes(time.Minute) || x.Buffered() != len("-last") {
		t.Fatalf("after the engine wrote: %d bytes buffered, want 5", x.Buffered())
	}
	if rest, err := io.ReadAll(body); err != nil || string(rest) != "-last" {
		t.Fatalf("the rest of the body: %q, %v", rest, err)
	}
}

// TestSilentBodyFailsWithTheIdleTimeout: a body that stops short and stays
// silent past the idle timeout fails with a timeout error.
func TestSilentBodyFailsWithTheIdleTimeout(t *testing.T) {
	closed := make(chan struct{})
	e := startEngine(t, func(c *engineConn) {
		defer close(closed)
		if _, ok := c.request(); ok {
			c.send("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
			c.awaitClose()
		}
	})
	cfg := testConfig()
	cfg.IdleTimeout = 50 * time.Millisecond
	x, resp := exchange(t, newClient(t, e, cfg), Body{Edit: edited("hi")})
	got, err := io.ReadAll(x.Body(resp))
	x.Finish(resp, false)
	var ne net.Error
	if string(got) != "half" || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read %q, %v; want half, then a timeout", got, err)
	}
	<-closed
}

// watcher is a client's connection as an exchange watches it.
type watcher struct {
	watched   chan func() // the abort of each Watch
	unwatched atomic.Int32
}

func (w *watcher) Watch(abort func()) { w.watched <- abort }
func (w *watcher) Unwatch()           { w.unwatched.Add(1) }

// lateBody is a 1 MiB body whose first 8 KiB are there at once, so the
// engine gets the request's headers, and the rest only once open is
// closed.
type lateBody struct{ open <-chan struct{} }

func (b lateBody) Len() int { return 1 << 20 }
func (b lateBody) Reader() io.Reader {
	return io.MultiReader(strings.NewReader(strings.Repeat("x", 8<<10)), gate(b.open),
		strings.NewReader(strings.Repeat("x", b.Len()-8<<10)))
}

// gate reads as empty once it is closed.
type gate <-chan struct{}

func (g gate) Read([]byte) (int, error) {
	<-g
	return 0, io.EOF
}

// failing is a reader that fails with err.
type failing struct{ err error }

func (r failing) Read([]byte) (int, error) { return 0, r.err }

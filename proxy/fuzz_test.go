package proxy

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

// FuzzRawRequest feeds raw bytes, any number of requests, to the sidecar's
// server and checks what reaches the engine against Go's strict HTTP/1.1
// parser reading the same bytes: the engine gets requests in order, each
// one that parser also reads from the client's bytes, with the same
// method, target and body, and never more of them. Nothing else reaches
// the engine, whatever the framing, and the sidecar never panics. The
// seeds run in every `go test`; `go test ./proxy -run '^$' -fuzz
// FuzzRawRequest` fuzzes.
func FuzzRawRequest(f *testing.F) {
	for _, seed := range []string{
		"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n\r\n{\"model\":\"m\"}",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 56\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n folded\r\n\r\n{}",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n{}",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2;ext=1\r\n{}\r\n0\r\nTrailer: x\r\n\r\n",
		"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\n{}\n0\n\n",
		"GET http://elsewhere/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n",
		"GET /v1/models HTTP/1.0\r\n\r\n",
		"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
		"GET /v1/models HTTP/1.1\nHost: x\n\n",
		"GET  /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
		"G\x00T /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	engine := newRecordingEngine(f)
	cfg := DefaultConfig()
	cfg.Upstream = engine.url()
	cfg.Mode = rewrite.ModeOff // bodies pass unchanged, so they compare as sent
	cfg.AccessLog = false
	p, err := New(cfg, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(p.up.CloseIdle)
	f.Fuzz(func(t *testing.T, raw []byte) {
		engine.reset()
		c := &bytesConn{in: bytes.NewReader(raw)}
		p.server.ServeConn(c) //nolint:errcheck // malformed input ends in errors
		got := engine.reset()
		want := strictRequests(raw)
		if len(got) > len(want) {
			t.Fatalf("the engine got %d requests, Go's parser reads %d in %q:\n%+v", len(got), len(want), raw, got)
		}
		for i, r := range got {
			if r.malformed {
				t.Fatalf("request %d reached the engine malformed from %q", i, raw)
			}
			if w := want[i]; r.method != w.method || r.target != w.target || !bytes.Equal(r.body, w.body) {
				t.Fatalf("request %d reached the engine as %s %s %q, the client sent %s %s %q, in %q",
					i, r.method, r.target, r.body, w.method, w.target, w.body, raw)
			}
		}
		if out := c.out.String(); out != "" && !strings.HasPrefix(out, "HTTP/1.1 ") {
			t.Fatalf("the client got %q, not an HTTP response", out)
		}
		if n := panicsCounted(t, p.registry); n != 0 {
			t.Fatalf("%v panics serving %q", n, raw)
		}
	})
}

// seenRequest is a request as the engine, or Go's parser, read it.
type seenRequest struct {
	method, target string
	body           []byte
	malformed      bool
}

// strictRequests reads raw as Go's net/http server would, request by
// request, stopping at the first it refuses.
func strictRequests(raw []byte) []seenRequest {
	var reqs []seenRequest
	br := bufio.NewReader(bytes.NewReader(raw))
	for {
		// Empty lines before a request line are allowed (RFC 9112
		// section 2.2), which fasthttp skips and Go's parser does not.
		for {
			if b, err := br.Peek(1); err != nil || (b[0] != '\r' && b[0] != '\n') {
				break
			}
			br.ReadByte() //nolint:errcheck // peeked
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return reqs
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return reqs
		}
		// The engine gets origin-form: an absolute-form target's path
		// and query as they were written (Go's RequestURI would
		// re-escape them).
		target := req.RequestURI
		if _, rest, ok := strings.Cut(target, "://"); ok && !strings.HasPrefix(target, "/") {
			if i := strings.IndexAny(rest, "/?"); i < 0 {
				target = "/"
			} else if rest[i] == '?' {
				target = "/" + rest[i:]
			} else {
				target = rest[i:]
			}
		}
		reqs = append(reqs, seenRequest{method: req.Method, target: target, body: body})
		if req.Close {
			return reqs
		}
	}
}

// recordingEngine answers every request "{}" and records what it read.
type recordingEngine struct {
	ln   net.Listener
	mu   sync.Mutex
	seen []seenRequest
}

func newRecordingEngine(tb testing.TB) *recordingEngine {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	e := &recordingEngine{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go e.serve(c)
		}
	}()
	tb.Cleanup(func() { ln.Close() })
	return e
}

func (e *recordingEngine) url() string { return "http://" + e.ln.Addr().String() }

func (e *recordingEngine) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil && upstream.IsConnGone(err) && br.Buffered() == 0 {
			return // the sidecar closed the connection between requests
		}
		var body []byte
		if err == nil {
			body, err = io.ReadAll(req.Body)
		}
		if err != nil {
			e.record(seenRequest{malformed: true})
			return
		}
		e.record(seenRequest{method: req.Method, target: req.RequestURI, body: body})
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"); err != nil {
			return
		}
	}
}

func (e *recordingEngine) record(r seenRequest) {
	e.mu.Lock()
	e.seen = append(e.seen, r)
	e.mu.Unlock()
}

// reset returns what the engine has read since the last reset.
func (e *recordingEngine) reset() []seenRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	seen := e.seen
	e.seen = nil
	return seen
}

// bytesConn is a client connection that sends fixed bytes, then closes,
// and keeps what the server writes.
type bytesConn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *bytesConn) Read(p []byte) (int, error)  { return c.in.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error) { return c.out.Write(p) }
func (c *bytesConn) Close() error                { return nil }
func (c *bytesConn) LocalAddr() net.Addr         { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8001} }
func (c *bytesConn) RemoteAddr() net.Addr {
	return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 50000}
}
func (c *bytesConn) SetDeadline(time.Time) error      { return nil }
func (c *bytesConn) SetReadDeadline(time.Time) error  { return nil }
func (c *bytesConn) SetWriteDeadline(time.Time) error { return nil }

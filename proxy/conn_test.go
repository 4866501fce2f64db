package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawRequest sends raw bytes to the sidecar and returns the connection.
func rawRequest(t *testing.T, base, raw string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := io.WriteString(conn, raw); err != nil {
		t.Fatal(err)
	}
	return conn
}

func TestBodyWithoutContentTypeGetsNone(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	body := `{"include_metrics":true}`
	conn := rawRequest(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 24\r\n\r\n"+body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if fr := engine.next(t); fr.Header.Get("Content-Type") != "" {
		t.Fatalf("the engine got Content-Type %q the client never sent", fr.Header.Get("Content-Type"))
	}
}

func TestHTTP10WithoutHost(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	conn := rawRequest(t, base, "GET /v1/models HTTP/1.0\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP/1.0 request without Host: %d", resp.StatusCode)
	}
}

// TestEngineHeadersPassAsSent: no Content-Type is invented, and the
// response keeps a Date (fasthttp sets its own).
func TestEngineHeadersPassAsSent(t *testing.T) {
	raw := newRawEngine(t, func(conn net.Conn) bool {
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nDate: Mon, 02 Jan 2006 15:04:05 GMT\r\nContent-Length: 2\r\n\r\nok")
		return true
	})
	base := startProxy(t, raw.url(), nil)
	resp, err := client.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct, ok := resp.Header["Content-Type"]; ok {
		t.Errorf("Content-Type %q added", ct)
	}
	if d, err := http.ParseTime(resp.Header.Get("Date")); err != nil || time.Since(d) > time.Minute {
		t.Errorf("Date = %q, want a current one", resp.Header.Get("Date"))
	}
}

// TestRequestIsRetriedWhenTheEngineClosesAsItArrives: the engine accepts
// the request on a kept-alive connection and closes it without a byte, as
// when its idle timer fires as the request goes out. The sidecar sends it
// once more on a new connection.
func TestRequestIsRetriedWhenTheEngineClosesAsItArrives(t *testing.T) {
	requests := 0
	raw := newRawEngine(t, func(conn net.Conn) bool {
		requests++
		if requests == 2 {
			return false // close without answering
		}
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
		return true
	})
	base := startProxy(t, raw.url(), nil)
	for i := 0; i < 2; i++ {
		resp := post(t, base+"/v1/chat/completions", `{"include_metrics":true}`, nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if requests != 3 || raw.accepted() != 2 {
		t.Fatalf("engine saw %d requests on %d connections, want 3 on 2", requests, raw.accepted())
	}
}

func TestDeadPooledConnectionsAreSkipped(t *testing.T) {
	engine := newFakeEngine(t, func(s *http.Server) { s.IdleTimeout = 30 * time.Millisecond })
	base := startProxy(t, engine.URL(), func(c *Config) { c.UpstreamKeepAlive = time.Minute })
	// Three requests at once leave three pooled connections.
	done := make(chan struct{}, 3)
	for i := 0; i < 3; i++ {
		go func() {
			resp := post(t, base+"/v1/chat/completions", `{}`, map[string]string{"X-Fake-TTFT": "50"})
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- struct{}{}
		}()
	}
	for i := 0; i < 3; i++ {
		<-done
	}
	for i := 0; i < engine.connections(); i++ {
		<-engine.closed // the engine dropped every idle connection
	}
	resp := post(t, base+"/v1/chat/completions", `{"include_metrics":true}`, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the engine dropped its idle connections: %d %s", resp.StatusCode, body)
	}
}

func TestPipelinedRequestIsWatchedToo(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), func(c *Config) { c.ClientReadTimeout = 100 * time.Millisecond })
	body := `{"model":"m"}`
	req := func(ttft string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Fake-TTFT: " + ttft + "\r\nContent-Length: 13\r\n\r\n" + body
	}
	conn := rawRequest(t, base, req("0")+req("5000"))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	engine.next(t)
	second := engine.next(t)
	// Let the read timeout armed for the pipelined request pass: it must
	// not end the watch.
	time.Sleep(200 * time.Millisecond)
	left := time.Now()
	conn.Close()
	awaitGone(t, second, left)
}

func TestHalfClosedClientGetsNoFalseSuccess(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	conn := rawRequest(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Fake-TTFT: 5000\r\nContent-Length: 2\r\n\r\n{}")
	engine.next(t)
	conn.(*net.TCPConn).CloseWrite()
	got, _ := io.ReadAll(conn)
	if len(got) > 0 {
		t.Fatalf("a request aborted for a half-closed client was answered: %q", got)
	}
}

// rawEngine is a TCP server whose connection handling the test scripts.
type rawEngine struct {
	ln    net.Listener
	conns chan struct{}
}

// newRawEngine reads request after request on each connection and lets
// serve answer each, until the client closes or serve returns false.
func newRawEngine(t *testing.T, serve func(net.Conn) bool) *rawEngine {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &rawEngine{ln: ln, conns: make(chan struct{}, 100)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			e.conns <- struct{}{}
			br := bufio.NewReader(conn)
			for readRequest(br) && serve(conn) {
			}
			conn.Close()
		}
	}()
	return e
}

func (e *rawEngine) url() string { return "http://" + e.ln.Addr().String() }

func (e *rawEngine) accepted() int { return len(e.conns) }

func readRequest(br *bufio.Reader) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, req.Body)
	return err == nil
}

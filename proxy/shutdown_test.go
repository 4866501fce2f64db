package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// streamAtShutdown starts a stream of tokens events, ITL apart, on a raw
// connection in the given protocol version, and returns its body once the
// first event has arrived (chunked or close-delimited, as the version
// has it).
func streamAtShutdown(t *testing.T, base, proto string, tokens int, itl time.Duration) *bufio.Reader {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second)) //nolint:errcheck // a hang fails, not stalls
	req := `{"model":"m","stream":true,"include_metrics":true,"messages":[]}`
	fmt.Fprintf(c, "POST /v1/chat/completions %s\r\nHost: x\r\nContent-Type: application/json\r\nX-Fake-Tokens: %d\r\nX-Fake-ITL: %d\r\nContent-Length: %d\r\n\r\n%s",
		proto, tokens, itl.Milliseconds(), len(req), req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body := bufio.NewReader(resp.Body)
	if _, err := body.ReadString('\n'); err != nil { // the first event's data line
		t.Fatal(err)
	}
	return body
}

// accessLogLines is the access log's request lines, decoded.
func accessLogLines(t *testing.T, log *syncBuffer) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, l := range log.lines() {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("access log line %q: %v", l, err)
		}
		if m["msg"] == "request" {
			lines = append(lines, m)
		}
	}
	return lines
}

// TestShutdownDrainsEveryStream: a stream open at shutdown, on HTTP/1.1
// (chunked) or HTTP/1.0 (close-delimited, on a connection fasthttp has
// handed over), runs to its end within the grace, is logged once with
// its status and the bytes its client got, and the shutdown is clean.
func TestShutdownDrainsEveryStream(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
		t.Run(proto, func(t *testing.T) {
			engine := newFakeEngine(t)
			var log syncBuffer
			p, base := startSidecar(t, engine.URL(), nil, &log)
			body := streamAtShutdown(t, base, proto, 8, 40*time.Millisecond)
			shut := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
				defer cancel()
				shut <- p.Shutdown(ctx)
			}()
			rest, _ := io.ReadAll(body)
			if got := string(rest); !strings.Contains(got, "data: [DONE]") {
				t.Fatalf("the stream was cut:\n%s", rest)
			}
			if err := <-shut; err != nil {
				t.Fatalf("shutdown: %v", err)
			}
			lines := accessLogLines(t, &log)
			if len(lines) != 1 || lines[0]["status"] != 200.0 || lines[0]["cut_at_shutdown"] != false || lines[0]["client_gone"] != false {
				t.Fatalf("access log: %v", lines)
			}
		})
	}
}

// TestShutdownCutsStreamsAtTheGrace: a stream still open when the grace
// runs out is cut, on either protocol version: its client's connection
// ends, it is logged once with its status, the bytes it sent and that it
// was cut, and the shutdown says how many it cut.
func TestShutdownCutsStreamsAtTheGrace(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
		t.Run(proto, func(t *testing.T) {
			engine := newFakeEngine(t)
			var log syncBuffer
			p, base := startSidecar(t, engine.URL(), nil, &log)
			body := streamAtShutdown(t, base, proto, 400, 50*time.Millisecond) // 20 s
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err := p.Shutdown(ctx)
			var cut streamsCut
			if !errors.As(err, &cut) || cut.n != 1 || !errors.Is(err, errInFlightAtGrace) {
				t.Fatalf("shutdown: %v, want one stream cut", err)
			}
			rest, _ := io.ReadAll(body)
			if strings.Contains(string(rest), "[DONE]") {
				t.Fatal("the stream ran to its end")
			}
			lines := accessLogLines(t, &log)
			if len(lines) != 1 || lines[0]["status"] != 200.0 || lines[0]["cut_at_shutdown"] != true || lines[0]["client_gone"] != false ||
				lines[0]["upstream_error"] != "" || lines[0]["bytes_out"].(float64) == 0 {
				t.Fatalf("access log: %v", lines)
			}
		})
	}
}

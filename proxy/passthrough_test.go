package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

func TestOtherPathsPassThroughUnchanged(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeAlways })
	tests := []struct {
		method, uri, body string
	}{
		{"GET", "/v1/models?b=2&a=%20x", ""},
		{"GET", "/health", ""},
		{"GET", "/metrics", ""},
		{"POST", "/v1/embeddings", `{"model":"m","input":"hi","include_metrics":true}`},
		{"GET", "/v1/chat/completions", ""},
		{"PUT", "/v1/completions", `{"include_metrics":true}`},
		{"POST", "/v1/chat/completions/extra", `{"include_metrics":true}`},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.uri, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, base+tt.uri, strings.NewReader(tt.body))
			req.Header.Set("X-Custom", "kept")
			req.Header.Set("Authorization", "Bearer sk-test")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fr := engine.next(t)
			<-fr.Finished
			if fr.Method != tt.method || fr.URI != tt.uri || string(fr.Body) != tt.body {
				t.Errorf("engine got %s %s %q", fr.Method, fr.URI, fr.Body)
			}
			if fr.Header.Get("X-Custom") != "kept" || fr.Header.Get("Authorization") != "Bearer sk-test" {
				t.Errorf("request headers not forwarded: %v", fr.Header)
			}
			if fr.Header.Get("X-Forwarded-For") != "127.0.0.1" {
				t.Errorf("X-Forwarded-For = %q", fr.Header.Get("X-Forwarded-For"))
			}
			if resp.StatusCode != 200 || resp.Header.Get("X-Engine") != "fake" || !bytes.Equal(got, fr.Sent.Bytes()) {
				t.Errorf("client got %d %v %q; engine sent %q", resp.StatusCode, resp.Header, got, fr.Sent.Bytes())
			}
		})
	}
}

func TestHeadRequestPassesThrough(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	resp, err := client.Head(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if fr := engine.next(t); fr.Method != "HEAD" || resp.StatusCode != 200 || resp.Header.Get("X-Engine") != "fake" {
		t.Fatalf("HEAD: engine got %s, client got %d %v", fr.Method, resp.StatusCode, resp.Header)
	}
}

// TestHopByHopHeadersAreRemovedBothWays sends raw HTTP so the test, not a
// client library, decides the headers.
func TestHopByHopHeadersAreRemovedBothWays(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	for _, path := range []string{"/v1/models", "/v1/chat/completions"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		body := `{"include_metrics":true}`
		io.WriteString(conn, "POST "+path+" HTTP/1.1\r\nHost: engine.local\r\n"+
			"Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nKeep-Alive: timeout=5\r\n"+
			"Proxy-Authorization: Basic eA==\r\nTe: trailers\r\nUpgrade: websocket\r\nX-Keep: yes\r\nX-Fake-Hop: 1\r\n"+
			"Content-Type: application/json\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		conn.Close()
		fr := engine.next(t)
		<-fr.Finished
		for _, h := range []string{"X-Drop", "Keep-Alive", "Proxy-Authorization", "Te", "Upgrade"} {
			if v := fr.Header.Get(h); v != "" {
				t.Errorf("%s: engine got %s: %s", path, h, v)
			}
		}
		if fr.Header.Get("X-Keep") != "yes" {
			t.Errorf("%s: X-Keep not forwarded", path)
		}
		for _, h := range []string{"X-Resp-Drop", "Keep-Alive"} {
			if v := resp.Header.Get(h); v != "" {
				t.Errorf("%s: client got %s: %s", path, h, v)
			}
		}
		if resp.Header.Get("X-Resp-Keep") != "1" || resp.Header.Get("X-Engine") != "fake" {
			t.Errorf("%s: engine's end-to-end headers lost: %v", path, resp.Header)
		}
	}
}

func TestUpstreamConnectionsAreReused(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	for i := 0; i < 5; i++ {
		for _, body := range []string{`{"stream":true,"include_metrics":true}`, `{"include_metrics":true}`, `{"stream":true}`} {
			resp := post(t, base+"/v1/chat/completions", body, nil)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	if n := engine.connections(); n != 1 {
		t.Fatalf("15 sequential requests used %d upstream connections, want 1", n)
	}
}

func TestRequestOnAConnectionTheEngineClosedIsRetried(t *testing.T) {
	engine := newFakeEngine(t, func(s *http.Server) { s.IdleTimeout = 20 * time.Millisecond })
	base := startProxy(t, engine.URL(), func(c *Config) { c.UpstreamKeepAlive = time.Minute })
	resp := post(t, base+"/v1/chat/completions", `{"include_metrics":true}`, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	<-engine.closed // the engine dropped the idle pooled connection
	resp = post(t, base+"/v1/chat/completions", `{"include_metrics":true}`, nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("request on a stale connection: %d %s", resp.StatusCode, body)
	}
	metricsOf(t, string(body))
	if n := engine.connections(); n != 2 {
		t.Fatalf("engine saw %d connections, want 2 (the stale one and the retry's)", n)
	}
}

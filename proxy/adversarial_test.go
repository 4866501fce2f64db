package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
)

// The tests in this file try the sidecar as an attacker would: raw bytes
// from an unauthenticated client, and an engine that misbehaves. Each
// provokes one attack the README's Guarantees table lists, and checks that
// the process keeps serving, that nothing reaches the engine the client
// did not send as one well-framed request, and that no client gets bytes
// meant for another.

// stillServes checks that the sidecar answers a plain request.
func stillServes(t *testing.T, base string) {
	t.Helper()
	resp, err := client.Get(base + "/v1/models")
	if err != nil {
		t.Fatalf("the sidecar no longer serves: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// startDebugLoggedSidecar runs a sidecar whose operational log, debug
// level included, is kept for the test to search.
func startDebugLoggedSidecar(t *testing.T, upstream string, configure func(*Config)) (string, *syncBuffer) {
	t.Helper()
	opLog := new(syncBuffer)
	cfg := DefaultConfig()
	cfg.Upstream = upstream
	if configure != nil {
		configure(&cfg)
	}
	_, base := serveSidecar(t, cfg, slog.New(slog.NewJSONHandler(opLog, &slog.HandlerOptions{Level: slog.LevelDebug})), nil)
	return base, opLog
}

// exposition is the whole /metrics text of p.
func exposition(t *testing.T, p *Proxy) string {
	t.Helper()
	families, err := p.registry.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var b strings.Builder
	for _, mf := range families {
		b.WriteString(mf.String())
	}
	return b.String()
}

func TestClientInputInLabelsCannotCrashTheSidecar(t *testing.T) {
	for _, mode := range []rewrite.Mode{rewrite.ModeOff, rewrite.ModeOptIn} {
		for _, engineUp := range []bool{true, false} {
			upstream := "http://127.0.0.1:1" // nothing listens there
			if engineUp {
				upstream = newFakeEngine(t).URL()
			}
			var accessLog syncBuffer
			p, base := startSidecar(t, upstream, func(c *Config) {
				c.Mode = mode
				c.TenantHeader, c.TenantLabel = "X-Tenant", true
			}, &accessLog)
			for _, body := range []string{
				"{\"model\":\"m\xff\",\"include_metrics\":true}",
				"{\"model\":\"m\xff\",\"stream\":true}",
				`{"model":"` + strings.Repeat("m", 1<<20) + `"}`,
			} {
				resp := post(t, base+"/v1/chat/completions", body, map[string]string{"X-Tenant": "t\xfe"})
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			stillServes(t, base)
			text := exposition(t, p)
			if len(text) > 1<<20 {
				t.Errorf("mode %s, engine up %v: a 1 MB model name made a %d-byte exposition", mode, engineUp, len(text))
			}
			p.telemetry.Flush()
			for _, line := range accessLog.lines() {
				if !json.Valid([]byte(line)) {
					t.Fatalf("an access-log line is not valid JSON: %.200q", line)
				}
				if len(line) > 8<<10 {
					t.Fatalf("an access-log line of %d bytes: client input is not bounded", len(line))
				}
			}
		}
	}
}

// panicWriter is an access log whose every write panics: a bug on the
// log's own goroutine, outside any request's panic boundary.

type panicWriter struct{}

func (panicWriter) Write([]byte) (int, error) { panic("access log bug") }

func TestPanicWhileRecordingIsContained(t *testing.T) {
	engine := newFakeEngine(t)
	p, base := startSidecar(t, engine.URL(), nil, panicWriter{})
	for i := range 3 {
		resp := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"include_metrics":true}`, nil)
		if _, err := readEvents(t, resp.Body); err != io.EOF {
			t.Fatalf("stream %d: %v", i, err)
		}
		resp.Body.Close()
		resp = post(t, base+"/v1/chat/completions", `{"model":"m","include_metrics":true}`, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
	}
	// Each batch of lines that reached the output cost one panic, counted,
	// and its lines, counted as dropped; the process served on.
	p.telemetry.Flush()
	eventually(t, "the writer's panics counted", func() bool { return panicsCounted(t, p.registry) >= 1 })
	if d := counterValue(t, p, "timing_sidecar_access_log_dropped_total", map[string]string{}); d != 6 {
		t.Errorf("%v access-log lines counted as dropped, want the 6 written", d)
	}
	if g := gaugeValue(t, p.registry, "timing_sidecar_in_flight_requests"); g != 0 {
		t.Fatalf("in-flight gauge %v after every request ended", g)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range families {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no series %s", name)
	return 0
}

func TestDeeplyNestedBodiesAreForwardedUnread(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeAlways })
	const depth = 6 << 20 // 12 MB: once a stack overflow, which no recover catches
	body := `{"model":"m","messages":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`
	resp := post(t, base+"/v1/chat/completions", body, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if fr := engine.next(t); !bytes.Equal(fr.Body, []byte(body)) {
		t.Fatalf("the engine got %d bytes, not the client's %d unchanged", len(fr.Body), len(body))
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if ms.StackInuse > 64<<20 {
		t.Fatalf("goroutine stacks hold %d MB after one nested request", ms.StackInuse>>20)
	}
	stillServes(t, base)
}

func TestMalformedFramingIsRefused(t *testing.T) {
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
		c.Close()
	})
	base := startProxy(t, engine.URL(), nil)
	// smuggled is a second request hidden in the first one's body.
	const smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\nX-Smuggled: 1\r\n\r\n"
	for _, tt := range []struct {
		name, raw string
		status    int
	}{
		{"length and chunked", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", 400},
		{"length and an empty chunked body", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 56\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400},
		{"two lengths", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", 400},
		{"identity coding, no length", "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n" + smuggled, 400},
		{"identity coding and a length", "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nTransfer-Encoding: identity\r\n\r\n{}" + smuggled, 400},
		{"a space in a header name", "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer Encoding: chunked\r\nContent-Length: 2\r\n\r\n{}", 400},
		{"a malformed percent-encoding", "GET /v1/%0Xmodels HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"a fragment", "GET http://x#y/v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 400},
		{"an unknown HTTP version", "GET /v1/models HTTP/9.9\r\nHost: x\r\n\r\n", 505},
		{"CONNECT", "CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n", 405},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := rawExchange(t, base, tt.raw)
			var e errorBody
			if resp.StatusCode != tt.status || json.Unmarshal(body, &e) != nil || e.Error.Type != "invalid_request_error" {
				t.Errorf("got %d %s, want a %d error", resp.StatusCode, body, tt.status)
			}
			if !resp.Close {
				t.Errorf("the connection stays open after a request whose end is unknown")
			}
			noRequest(t, engine.requests)
		})
	}
}

func TestAbsoluteFormIsForwardedAsOriginForm(t *testing.T) {
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
		c.Close()
	})
	base := startProxy(t, engine.URL(), nil)
	for target, want := range map[string]string{
		"http://elsewhere.example/v1/models?x=1": "/v1/models?x=1",
		"http://elsewhere.example":               "/",
		"http://elsewhere.example?x=1":           "/?x=1",
	} {
		resp, _ := rawExchange(t, base, "GET "+target+" HTTP/1.1\r\nHost: x\r\n\r\n")
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", target, resp.StatusCode)
		}
		if got := (<-engine.requests).URI; got != want {
			t.Errorf("%s reached the engine as %q, want %q", target, got, want)
		}
	}
}

// writeWhole writes a request whole before reading anything, as Python's
// http.client and urllib do, and returns the response.
func writeWhole(t *testing.T, base, head string, body int) (*http.Response, []byte, error) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		return nil, nil, err
	}
	chunk := bytes.Repeat([]byte("x"), 64<<10)
	for sent := 0; sent < body; sent += len(chunk) {
		if _, err := c.Write(chunk[:min(len(chunk), body-sent)]); err != nil {
			return nil, nil, err
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, nil, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, b, nil
}

func TestOverLimitRequestsGetTheirAnswerNotAReset(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), func(c *Config) { c.MaxRequestBodySize = 1 << 20 })
	const body = 20 << 20
	for i := range 5 {
		head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " + itoa(body) + "\r\n\r\n"
		resp, got, err := writeWhole(t, base, head, body)
		if err != nil {
			t.Fatalf("client writing the whole body first, try %d: %v, want the 413", i, err)
		}
		if resp.StatusCode != 413 || !bytes.Contains(got, []byte(`"code":"request_too_large"`)) {
			t.Fatalf("try %d: %d %s", i, resp.StatusCode, got)
		}
		// Go's net/http client, which also writes before it reads.
		r, err := client.Post(base+"/v1/chat/completions", "application/json", bytes.NewReader(make([]byte, body)))
		if err != nil {
			t.Fatalf("net/http client, try %d: %v, want the 413", i, err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode != 413 {
			t.Fatalf("net/http client, try %d: status %d", i, r.StatusCode)
		}
	}
	// Headers over the limit, with a body behind them.
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("h", 16<<10) + "\r\nContent-Length: " + itoa(1<<20) + "\r\n\r\n"
	resp, _, err := writeWhole(t, base, head, 1<<20)
	if err != nil || resp.StatusCode != 431 {
		t.Fatalf("headers over the limit: %v %v, want a 431", resp, err)
	}
	noRequest(t, engine.arrived)
}

func TestExpectContinueRefusesAtOnce(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), func(c *Config) { c.MaxRequestBodySize = 1 << 20 })
	c := rawRequest(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: "+itoa(20<<20)+"\r\n\r\n")
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// The client sends nothing more until it hears back.
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || !bytes.Contains(body, []byte(`"code":"request_too_large"`)) {
		t.Fatalf("got %d %s, want the 413 before the body is sent", resp.StatusCode, body)
	}
	// Within the limit, the body is invited as usual.
	c = rawRequest(t, base, "POST /v1/models HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
	c.SetDeadline(time.Now().Add(10 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	if !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("a request within the limit got %q, want 100 Continue", line)
	}
	noRequest(t, engine.arrived)
}

func TestLateBytesPastAResponseNeverReachTheNextClient(t *testing.T) {
	const secret = "SECRET-OUTPUT of tenant A"
	sendLate, lateSent := make(chan struct{}), make(chan struct{})
	var conns atomic.Int32
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		if conns.Add(1) == 1 {
			// A complete response, then, in a later segment, more.
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
			<-sendLate
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 25\r\n\r\n"+secret)
			close(lateSent)
			io.Copy(io.Discard, c)
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
	})
	base, opLog := startDebugLoggedSidecar(t, engine.URL(), func(c *Config) { c.UpstreamHeaderTimeout = 2 * time.Second })
	for i, want := range []string{`{}`, `{"ok":true}`} {
		resp, err := client.Get(base + "/v1/models")
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != want {
			t.Fatalf("client %d got %d %s, want %s", i+1, resp.StatusCode, got, want)
		}
		if i == 0 {
			close(sendLate)
			<-lateSent
		}
	}
	if strings.Contains(opLog.String(), secret) {
		t.Fatalf("the log holds another client's output:\n%s", opLog.String())
	}
}

func TestEngineStoppingShortOfItsLength(t *testing.T) {
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		// 40 of the 100 bytes promised, then a close.
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"+`{"id":"x","choices":[],"object":"list",`)
		c.Close()
	})
	// Opt-in: a request without include_metrics gets none, so its body
	// passes through as it comes.
	base := startProxy(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeOptIn })
	t.Run("passed through: what arrived, then a failure", func(t *testing.T) {
		for _, send := range []func() (*http.Response, error){
			func() (*http.Response, error) { return client.Get(base + "/v1/models") },
			func() (*http.Response, error) {
				return client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m"}`))
			},
		} {
			resp, err := send()
			if err != nil {
				t.Fatalf("no status: %v", err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(got) != `{"id":"x","choices":[],"object":"list",` || !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("got %d %q (%v), want 200, the 40 bytes, then an unexpected EOF", resp.StatusCode, got, err)
			}
		}
	})
	t.Run("measured for metrics: a 502", func(t *testing.T) {
		resp := post(t, base+"/v1/chat/completions", `{"model":"m","include_metrics":true}`, nil)
		openAIError(t, resp, 502, "upstream_interrupted")
	})
}

func TestEventStreamMediaTypeIsCaseInsensitive(t *testing.T) {
	const usage = `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}` + "\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: Text/Event-Stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"+
			chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(usage)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true}`, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(got), `"usage"`) {
		t.Fatalf("the usage event the sidecar asked for reached the client:\n%s", got)
	}
	resp = post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`, nil)
	got, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(got), `"metrics":{`) {
		t.Fatalf("no metrics on the usage event:\n%s", got)
	}
}

func TestConnectionHeaderCannotStripTheRequestID(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	for _, sent := range []string{"client-id-1", ""} {
		headers := map[string]string{"Connection": "X-Request-Id"}
		if sent != "" {
			headers["X-Request-Id"] = sent
		}
		resp := post(t, base+"/v1/chat/completions", `{"model":"m"}`, headers)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got := engine.next(t).Header.Get("X-Request-Id")
		if got == "" || (sent != "" && got != sent) || got != resp.Header.Get("X-Request-Id") {
			t.Fatalf("sent %q: the engine got request id %q, the client %q", sent, got, resp.Header.Get("X-Request-Id"))
		}
	}
}

func TestErrorsNeverQuoteWhatTheyRead(t *testing.T) {
	const secret = "sk-SECRET"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		// Not HTTP: an engine's bytes, which may be another client's output.
		io.WriteString(c, `{"output": "`+secret+`"}`+"\r\n\r\n")
		c.Close()
	})
	base, opLog := startDebugLoggedSidecar(t, engine.URL(), nil)
	for name, raw := range map[string]string{
		"a header value with a control byte": "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\x01\r\nContent-Length: 2\r\n\r\n{}",
		"an unparsable header line":          "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization Bearer " + secret + "\r\nContent-Length: 2\r\n\r\n{}",
		"an unparsable engine response":      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer x\r\nContent-Length: 2\r\n\r\n{}",
	} {
		resp, body := rawExchange(t, base, raw)
		if resp.StatusCode < 400 || strings.Contains(string(body), secret) || strings.Contains(string(body), "Bearer") {
			t.Errorf("%s: %d %s", name, resp.StatusCode, body)
		}
	}
	if strings.Contains(opLog.String(), secret) {
		t.Fatalf("the log quotes what it read:\n%s", opLog.String())
	}
}

func TestOnlyOneEventCarriesTheMetrics(t *testing.T) {
	const usage = `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}` + "\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(usage)+chunk(usage)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"model":"m","stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := strings.Count(string(got), `"metrics":`); n != 1 || strings.Count(string(got), `"usage"`) != 2 {
		t.Fatalf("%d events carry metrics, want the first usage event only:\n%s", n, got)
	}
}

func TestAdminPortClosesIdleConnections(t *testing.T) {
	engine := newFakeEngine(t)
	p, _ := startSidecar(t, engine.URL(), nil, nil)
	if p.admin.IdleTimeout <= 0 || p.admin.ReadHeaderTimeout <= 0 {
		t.Fatalf("admin server idle timeout %v, header timeout %v: an idle connection is held forever",
			p.admin.IdleTimeout, p.admin.ReadHeaderTimeout)
	}
	p.admin.IdleTimeout = 100 * time.Millisecond // the behaviour, in test time
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.ServeAdmin(ln)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle admin connection was not closed: %v", err)
	}
}

func TestReadinessReasonHidesTheProbeQuery(t *testing.T) {
	p, _ := startSidecar(t, "http://127.0.0.1:1", func(c *Config) { c.ReadinessPath = "/health?token=SECRET" }, nil)
	p.ready.set(p.probe())
	rec := httptest.NewRecorder()
	p.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if rec.Code != 503 || strings.Contains(rec.Body.String(), "SECRET") || !strings.Contains(rec.Body.String(), "GET /health") {
		t.Fatalf("/readyz: %d %s", rec.Code, rec.Body.String())
	}
}

// TestRequestTrailersAreNotHeaders: a field in a chunked request's trailer
// section is not a header (RFC 9110 §6.5.1). Behind a gateway that filters
// headers but passes trailers, reading one as a header would let a client
// pick its tenant or request id. Trailers are dropped: the sidecar sends
// the engine the body it holds with a Content-Length, which has no trailer
// section.
func TestRequestTrailersAreNotHeaders(t *testing.T) {
	engine := newFakeEngine(t)
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.TenantHeader = "X-Tenant" }, &log)
	body := `{"model":"m"}`
	for _, tc := range []struct {
		name, header, tenant string
	}{
		{"only in the trailer", "", ""},
		{"a header and a trailer of the same name", "X-Tenant: real\r\n", "real"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + tc.header +
				"Trailer: X-Tenant, X-Request-Id, X-Extra\r\nTransfer-Encoding: chunked\r\n\r\n" +
				fmt.Sprintf("%x\r\n%s\r\n0\r\nX-Tenant: via-trailer\r\nX-Request-Id: chosen-by-client\r\nX-Extra: 1\r\n\r\n", len(body), body)
			resp, _ := rawExchange(t, base, raw)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			fr := engine.next(t)
			if got := fr.Header.Values("X-Tenant"); strings.Join(got, ",") != tc.tenant {
				t.Errorf("the engine got X-Tenant %q, want %q", got, tc.tenant)
			}
			if id := fr.Header.Get("X-Request-Id"); id == "chosen-by-client" || id == "" {
				t.Errorf("the engine got request id %q, want one the sidecar made", id)
			}
			if fr.Header.Get("X-Extra") != "" || fr.Header.Get("Trailer") != "" {
				t.Errorf("trailer fields reached the engine as headers: %v", fr.Header)
			}
			p.telemetry.Flush()
			lines := log.lines()
			if last := lines[len(lines)-1]; !strings.Contains(last, `"tenant":"`+tc.tenant+`"`) || strings.Contains(last, "chosen-by-client") {
				t.Errorf("the access log took a trailer as a header: %s", last)
			}
		})
	}
}

// TestMalformedEngineAnswers: an answer that is no final HTTP status (000,
// which fasthttp reads as 200; 099; 101 to a request that asked for no
// upgrade; 600), or a header block parsers could read two ways (a field
// name that is not a token, such as "Transfer-Encoding " with a space
// before the colon over an identity body; a Content-Length with a
// Transfer-Encoding; a Transfer-Encoding that does not end in chunked),
// gives the client a clear 502 before any byte, as the same in a request
// gives a 400, and counts as a bad response: never a relayed, masked or
// empty answer.
func TestMalformedEngineAnswers(t *testing.T) {
	const jsonHead = "Content-Type: application/json\r\n"
	for name, head := range map[string]string{
		"status 000":               "HTTP/1.1 000 Zero\r\n" + jsonHead + "Content-Length: 2\r\n",
		"status 099":               "HTTP/1.1 099 Low\r\n" + jsonHead + "Content-Length: 2\r\n",
		"status 101":               "HTTP/1.1 101 Switching Protocols\r\n" + jsonHead + "Content-Length: 2\r\n",
		"status 600":               "HTTP/1.1 600 High\r\n" + jsonHead + "Content-Length: 2\r\n",
		"a space before the colon": "HTTP/1.1 200 OK\r\nTransfer-Encoding : chunked\r\n" + jsonHead,
		"a name that is no token":  "HTTP/1.1 200 OK\r\nX(y): 1\r\n" + jsonHead + "Content-Length: 2\r\n",
		"both framings":            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n" + jsonHead,
		"chunked not last":         "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, identity\r\n" + jsonHead,
	} {
		t.Run(name, func(t *testing.T) {
			engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
				defer c.Close()
				io.WriteString(c, head+"\r\n{}")
			})
			p, base := startSidecar(t, engine.URL(), nil, nil)
			resp := post(t, base+"/v1/chat/completions", `{"model":"m","include_metrics":true}`, nil)
			openAIError(t, resp, http.StatusBadGateway, "bad_response")
			if got := counterValue(t, p, "timing_sidecar_upstream_errors_total", map[string]string{"kind": "bad_response"}); got != 1 {
				t.Errorf("bad_response errors counted %v, want 1", got)
			}
		})
	}
}

// TestBodiesPastTheMemoryBudgetStreamThrough: a body the --max-body-memory
// budget has no room for, of known length or chunked, goes to the engine
// as the client sent it, unread and unedited, and its client gets the
// engine's answer (without the metrics object): memory bounds what the
// sidecar reads, never what it serves. A body with room is read and
// edited as ever.
func TestBodiesPastTheMemoryBudgetStreamThrough(t *testing.T) {
	engine := newFakeEngine(t)
	// Bodies larger than the whole budget: no wait for room that cannot
	// come. A chunked one holds what it has read and does not wait.
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.MaxBodyMemory = 32 << 10 }, nil)
	big := `{"model":"m","stream":true,"include_metrics":true,"messages":[{"role":"user","content":"` + strings.Repeat("a", 100<<10) + `"}]}`
	small := `{"model":"m","stream":true,"include_metrics":true,"messages":[{"role":"user","content":"` + strings.Repeat("a", 20<<10) + `"}]}`
	chunked := func(body string) string {
		return "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
			fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	}
	sized := func(body string) string {
		return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	for _, tc := range []struct {
		name, raw, body string
		read            bool
	}{
		{"known length, no room", sized(big), big, false},
		{"chunked, no room", chunked(big), big, false},
		{"known length, room", sized(small), small, true},
		{"chunked, room", chunked(small), small, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, events := rawExchange(t, base, tc.raw)
			if resp.StatusCode != 200 || !strings.Contains(string(events), "data: [DONE]") {
				t.Fatalf("status %d: %.200s", resp.StatusCode, events)
			}
			fr := engine.next(t)
			if unread := bytes.Equal(fr.Body, []byte(tc.body)); unread == tc.read {
				t.Fatalf("read %v: the engine got the body unchanged: %v", tc.read, unread)
			}
			if got := strings.Contains(string(events), `"metrics"`); got != tc.read {
				t.Fatalf("metrics in the answer: %v, want %v", got, tc.read)
			}
			if used := p.bodies.Used(); used != 0 {
				t.Fatalf("%d bytes of the budget still held", used)
			}
		})
	}
	stillServes(t, base)
}

// TestEngineTrailersAreDropped: a trailer section from the engine with
// fields forbidden in trailers (Content-Type, Set-Cookie) or malformed
// comes after the body's last chunk: the body is whole, the client gets
// all of it and a clean end, and nothing counts as an engine failure.
func TestEngineTrailersAreDropped(t *testing.T) {
	for _, trailer := range []string{"Set-Cookie: a=b\r\nX-Ok: 1\r\n", "Content-Type: text/plain\r\n", "X Bad: 1\r\n"} {
		for _, stream := range []bool{true, false} {
			engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
				defer c.Close()
				if stream {
					io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(shapeEvent(0, `{}`, "", "stop", ""))+chunk("data: [DONE]\n\n")+"0\r\n"+trailer+"\r\n")
					return
				}
				body := `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}`
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"+chunk(body)+"0\r\n"+trailer+"\r\n")
			})
			p, base := startSidecar(t, engine.URL(), nil, nil)
			resp := post(t, base+"/v1/chat/completions", fmt.Sprintf(`{"stream":%v,"include_metrics":true}`, stream), nil)
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || !strings.Contains(string(got), `"metrics":{`) {
				t.Fatalf("trailer %q, stream %v: status %d, %v:\n%s", trailer, stream, resp.StatusCode, err, got)
			}
			if stream && !strings.HasSuffix(string(got), "data: [DONE]\n\n") {
				t.Fatalf("trailer %q: the stream did not end whole:\n%s", trailer, got)
			}
			if n := counterValue(t, p, "timing_sidecar_upstream_errors_total", map[string]string{"kind": "interrupted"}); n != 0 {
				t.Fatalf("trailer %q: counted as an engine failure", trailer)
			}
		}
	}
}

// TestEarlyAnswersFromTheEngineAreRelayed: an engine that answers before
// it has read the whole body (a 413 over its own size limit, as llama.cpp's
// server does) and closes: the client gets that answer as the engine sent
// it, whether the sidecar read the body first or streamed it through, and
// it is no engine failure.
func TestEarlyAnswersFromTheEngineAreRelayed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	answer := `{"error":{"code":413,"message":"request too large","type":"invalid_request_error"}}`
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil || line == "\r\n" {
						break
					}
				}
				fmt.Fprintf(c, "HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(answer), answer)
			}()
		}
	}()
	p, base := startSidecar(t, "http://"+ln.Addr().String(), func(c *Config) { c.MaxBodyMemory = 16 << 20 }, nil)
	for _, size := range []int{8 << 20, 30 << 20} { // read first; streamed through (over the budget)
		body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("a", size) + `"}]}`
		resp := post(t, base+"/v1/chat/completions", body, nil)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 413 || string(got) != answer {
			t.Fatalf("%d MB: status %d, %.200s; want the engine's 413", size>>20, resp.StatusCode, got)
		}
	}
	for _, kind := range []string{"closed", "connect", "interrupted"} {
		if n := counterValue(t, p, "timing_sidecar_upstream_errors_total", map[string]string{"kind": kind}); n != 0 {
			t.Errorf("an early answer counted as an engine failure (%s)", kind)
		}
	}
}

// TestHeldResponsesShareTheMemoryBudget: a non-streaming response held to
// splice the metrics in takes room in --max-body-memory past its first
// 64 KiB, for the engine's body and for the spliced copy; one the budget
// has no room for passes through as the engine sent it, without metrics,
// as one over --max-buffered-response-size.
func TestHeldResponsesShareTheMemoryBudget(t *testing.T) {
	answer := func(size int) string {
		return `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"` +
			strings.Repeat("x", size) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`
	}
	engine := newScriptedEngine(t, func(c net.Conn, req *http.Request, _ []byte) {
		defer c.Close()
		size, _ := strconv.Atoi(req.Header.Get("X-Size"))
		body := answer(size)
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	})
	// Room for a 100 KiB answer twice (its read may take up to 64 KiB
	// ahead), not for a 400 KiB one once.
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.MaxBodyMemory = 320 << 10 }, nil)
	// One connection: each request is served once the one before it has
	// ended, its budget given back.
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	body := `{"model":"m","include_metrics":true}`
	for _, tc := range []struct {
		size    int
		metrics bool
	}{{400 << 10, false}, {100 << 10, true}} {
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Size: %d\r\nContent-Length: %d\r\n\r\n%s", tc.size, len(body), body)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || strings.Contains(string(got), `"metrics":{`) != tc.metrics {
			t.Fatalf("%d KB: status %d, metrics %v, want %v", tc.size>>10, resp.StatusCode, !tc.metrics, tc.metrics)
		}
		if !tc.metrics && string(got) != answer(tc.size) {
			t.Fatalf("%d KB: not the engine's answer as sent", tc.size>>10)
		}
	}
	// A held answer's room comes back once fasthttp has written it, which
	// may be just after the client has read it all.
	eventually(t, "the budget given back", func() bool { return p.bodies.Used() == 0 })
}

// TestRepeatedMembersAreForwardedUnread: a request that repeats a member
// the sidecar reads or edits goes to the engine exactly as it came, is
// answered without the metrics object, and is counted.
func TestRepeatedMembersAreForwardedUnread(t *testing.T) {
	engine := newFakeEngine(t)
	p, base := startSidecar(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeAlways }, nil)
	body := `{"model":"m","stream":true,"stream_options":{"include_usage":false},"messages":[],"stream_options":{"include_usage":true}}`
	resp := post(t, base+"/v1/chat/completions", body, nil)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if fr := engine.next(t); string(fr.Body) != body {
		t.Fatalf("the engine got %s, not the client's body", fr.Body)
	}
	if resp.StatusCode != 200 || strings.Contains(string(got), `"metrics"`) {
		t.Fatalf("status %d, want the engine's answer without metrics:\n%s", resp.StatusCode, got)
	}
	if n := counterValue(t, p, "timing_sidecar_unread_requests_total", map[string]string{"reason": "repeated_member"}); n != 1 {
		t.Fatalf("counted %v repeated-member requests, want 1", n)
	}
}

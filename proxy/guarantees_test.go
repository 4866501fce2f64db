package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// The tests in this file provoke one fault each and check the outcome the
// README's Guarantees section promises for it.

const (
	sseHead   = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
	roleEvent = `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
)

func tokenEvent(text string) string {
	return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"` + text + `"},"finish_reason":null}]}` + "\n\n"
}

// rawExchange sends raw bytes on a new connection to the sidecar and
// returns the response, read with net/http's parser.
func rawExchange(t *testing.T, base, raw string) (*http.Response, []byte) {
	t.Helper()
	c := rawRequest(t, base, raw)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no response to %q: %v", raw, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

// noRequest checks that nothing reached the engine.
func noRequest[T any](t *testing.T, arrived chan T) {
	t.Helper()
	// A forward the sidecar should not make could be merely late: it is
	// waited for, for longer than one takes on a busy machine.
	select {
	case r := <-arrived:
		t.Fatalf("a request the sidecar refused reached the engine: %+v", r)
	case <-time.After(300 * time.Millisecond):
	}
}

func TestMalformedRequestBodiesAreForwardedUnchanged(t *testing.T) {
	// The engine owns its request schema: what the sidecar cannot read it
	// passes on as it came, and the engine's answer reaches the client.
	for _, body := range []string{
		`{"model":"m","messages":[`,
		`not json at all`,
		`{"model":"m","stream":"maybe","include_metrics":true}`,
		`{"model":"m","stream_options":"x","stream":true}`,
		`{"model":"m","n":"two"}`,
		`["a","b"]`,
	} {
		engine := newFakeEngine(t)
		base := startProxy(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeAlways })
		resp := post(t, base+"/v1/chat/completions", body, nil)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fr := engine.next(t)
		if string(fr.Body) != body {
			t.Errorf("engine got %q, client sent %q", fr.Body, body)
		}
		if resp.StatusCode != 200 || string(got) != fr.Sent.String() {
			t.Errorf("%q: client got %d %q, engine sent %q", body, resp.StatusCode, got, fr.Sent.String())
		}
	}
}

func TestIncludeMetricsOfTheWrongTypeIsRefused(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	for _, v := range []string{`"maybe"`, `2`, `0.5`, `{}`, `[true]`, `" true"`} { // what the engine refuses too
		openAIError(t, post(t, base+"/v1/chat/completions", `{"model":"m","include_metrics":`+v+`}`, nil),
			400, "invalid_include_metrics")
	}
	noRequest(t, engine.arrived)

	// With the sidecar off the field is not its business.
	off := startProxy(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeOff })
	resp := post(t, off+"/v1/chat/completions", `{"include_metrics":"maybe"}`, nil)
	resp.Body.Close()
	if fr := engine.next(t); resp.StatusCode != 200 || string(fr.Body) != `{"include_metrics":"maybe"}` {
		t.Fatalf("mode off: %d, engine got %q", resp.StatusCode, fr.Body)
	}
}

func TestSlowHeadersAreCutOff(t *testing.T) {
	engine := newFakeEngine(t)
	const timeout = 200 * time.Millisecond
	base := startProxy(t, engine.URL(), func(c *Config) { c.ClientReadTimeout = timeout })
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
	// One header byte every 20 ms: every read makes progress, and only a
	// bound on the whole header read stops it.
	closed := make(chan time.Time, 1)
	go func() {
		r := bufio.NewReader(c)
		resp, err := http.ReadResponse(r, nil)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != 408 {
				t.Errorf("status %d, want 408", resp.StatusCode)
			}
		}
		closed <- time.Now()
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	giveUp := time.After(10 * time.Second)
	for {
		select {
		case at := <-closed:
			// A timeout per read would never fire: the client trickles
			// a byte every 20 ms until giveUp. Any cut-off well before
			// that shows the bound is on the whole header read.
			if d := at.Sub(start); d > 2*time.Second {
				t.Fatalf("a trickling client held the connection %v; the read timeout is %v", d, timeout)
			}
			noRequest(t, engine.arrived)
			return
		case <-tick.C:
			c.Write([]byte("X"))
		case <-giveUp:
			t.Fatal("a trickling client was never cut off")
		}
	}
}

func TestSlowReaderHoldsTheEngineBack(t *testing.T) {
	// The engine sends 64 MB of events as fast as it can; the client reads
	// nothing for a while. The sidecar must not read ahead without bound:
	// the engine stalls once the socket buffers fill, and when the client
	// drains, every byte arrives in order.
	const total = 64 << 20
	event := "data: " + strings.Repeat("x", 4090) + "\n\n" // 4 KiB each
	var written atomic.Int64
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead)
		frame := chunk(event)
		for sent := 0; sent < total; sent += len(event) {
			if _, err := io.WriteString(c, frame); err != nil {
				return
			}
			written.Add(int64(len(event)))
		}
		io.WriteString(c, "0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true}`, nil)
	defer resp.Body.Close()

	// Wait for the engine to stall: no progress for 200 ms.
	last, still := written.Load(), time.Now()
	for deadline := time.Now().Add(20 * time.Second); time.Since(still) < 200*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatalf("the engine never stalled: %d bytes written", written.Load())
		}
		time.Sleep(10 * time.Millisecond) // polling a counter: there is no event to await
		if w := written.Load(); w != last {
			last, still = w, time.Now()
		}
	}
	// Kernel socket buffers on loopback take up to ~16 MB; the sidecar
	// itself holds at most one event buffer.
	if last >= total/2 {
		t.Fatalf("the engine wrote %d MB before stalling: the sidecar read ahead of its client", last>>20)
	}
	t.Logf("engine stalled after %d MB with the client reading nothing", last>>20)

	r := bufio.NewReaderSize(resp.Body, 64<<10)
	for n := 0; n < total; n += len(event) {
		line, err := r.ReadString('\n')
		if err != nil || line != event[:len(event)-1] {
			t.Fatalf("event %d: %d bytes, %v", n/len(event), len(line), err)
		}
		if blank, _ := r.ReadString('\n'); blank != "\n" {
			t.Fatalf("event %d not followed by a blank line", n/len(event))
		}
	}
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Fatalf("after the last event: %q, %v", rest, err)
	}
}

func TestUpstreamResetBeforeHeaders(t *testing.T) {
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) { reset(c) })
	base := startProxy(t, engine.URL(), nil)
	openAIError(t, post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil), 502, "upstream_unavailable")
}

func TestUpstreamResetMidStreamKeepsWhatArrived(t *testing.T) {
	delivered := make(chan struct{})
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(tokenEvent("b")))
		<-delivered // reset only once the client has what was sent
		reset(c)
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	want := roleEvent + tokenEvent("a") + tokenEvent("b")
	got := make([]byte, len(want))
	if _, err := io.ReadFull(r, got); err != nil || string(got) != want {
		t.Fatalf("before the reset the client got %q, %v", got, err)
	}
	close(delivered)
	if rest, err := io.ReadAll(r); err == nil || len(rest) != 0 {
		t.Fatalf("a reset stream ended cleanly (%q, %v); the client must see the failure", rest, err)
	}
}

func TestStreamRequestAnsweredWithoutEvents(t *testing.T) {
	for _, tt := range []struct {
		name, contentType, body string
		metrics                 bool
	}{
		{"JSON object", "application/json", `{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, true},
		{"plain text", "text/plain", "the engine does not stream", false},
		{"JSON array", "application/json", `[1,2]`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
				defer c.Close()
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: "+tt.contentType+"\r\nContent-Length: "+strconv.Itoa(len(tt.body))+"\r\n\r\n"+tt.body)
			})
			base := startProxy(t, engine.URL(), nil)
			resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true}`, nil)
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !tt.metrics {
				if string(got) != tt.body {
					t.Fatalf("client got %q, engine sent %q", got, tt.body)
				}
				return
			}
			var doc map[string]json.RawMessage
			if err := json.Unmarshal(got, &doc); err != nil || doc["metrics"] == nil || string(doc["id"]) != `"x"` {
				t.Fatalf("client got %s", got)
			}
		})
	}
}

func TestOversizedEventPassesIntact(t *testing.T) {
	big := `data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"` + strings.Repeat("y", 20000) + `"}}]}` + "\n\n"
	usage := `data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":3,"total_tokens":4}}` + "\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(big[:7000])+chunk(big[7000:])+
			chunk(tokenEvent("b"))+chunk(usage)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), func(c *Config) { c.MaxEventSize = 8 << 10 })
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`, nil)
	events, err := readEvents(t, resp.Body)
	resp.Body.Close()
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if len(events) != 6 || "data: "+events[2].data+"\n\n" != big {
		t.Fatalf("got %d events; the oversized one was not passed intact", len(events))
	}
	// Not inspected, but the stream around it still is.
	m := metricsOf(t, events[4].data)
	if m["completion_tokens"] == nil || *m["completion_tokens"] != 3 {
		t.Fatalf("metrics after an oversized event: %s", events[4].data)
	}
}

func TestEncodedResponseIsNeverCorrupted(t *testing.T) {
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	io.WriteString(zw, `{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	zw.Close()
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		// An engine that compresses whatever it is asked.
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: "+strconv.Itoa(zipped.Len())+"\r\n\r\n")
		c.Write(zipped.Bytes())
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"include_metrics":true}`, map[string]string{"Accept-Encoding": "gzip"})
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if req := <-engine.requests; req.Header.Get("Accept-Encoding") != "identity" {
		t.Errorf("a measured request asked the engine for %q, want identity", req.Header.Get("Accept-Encoding"))
	}
	if resp.Header.Get("Content-Encoding") != "gzip" || !bytes.Equal(got, zipped.Bytes()) {
		t.Fatalf("an encoded body was changed: %q, %d bytes", resp.Header.Get("Content-Encoding"), len(got))
	}
}

func TestMalformedUsageGivesNullCounts(t *testing.T) {
	for name, usage := range map[string]string{
		"non-numeric": `{"prompt_tokens":"seven","completion_tokens":null,"total_tokens":true}`,
		"missing":     `{}`,
		"not object":  `"lots"`,
		"negative":    `{"prompt_tokens":-1,"completion_tokens":-5}`,
	} {
		t.Run(name, func(t *testing.T) {
			ev := `data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":` + usage + `}` + "\n\n"
			engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
				defer c.Close()
				io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent("a"))+chunk(ev)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
			})
			base := startProxy(t, engine.URL(), nil)
			resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`, nil)
			events, _ := readEvents(t, resp.Body)
			resp.Body.Close()
			if len(events) != 4 {
				t.Fatalf("got %d events", len(events))
			}
			var doc map[string]json.RawMessage
			if err := json.Unmarshal([]byte(events[2].data), &doc); err != nil {
				t.Fatalf("invalid JSON where the sidecar spliced: %s", events[2].data)
			}
			if string(doc["usage"]) != usage {
				t.Fatalf("usage changed: %s", doc["usage"])
			}
			if doc["metrics"] != nil {
				isNull(t, metricsOf(t, events[2].data), "completion_tokens", "tokens_per_second")
			}
		})
	}
}

func TestEmptySuccessfulBodies(t *testing.T) {
	for _, tt := range []struct{ name, request, response string }{
		{"non-streaming", `{"include_metrics":true}`, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n"},
		{"stream", `{"stream":true,"include_metrics":true}`, sseHead + "0\r\n\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
				defer c.Close()
				io.WriteString(c, tt.response)
			})
			base := startProxy(t, engine.URL(), nil)
			resp := post(t, base+"/v1/chat/completions", tt.request, nil)
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || len(got) != 0 {
				t.Fatalf("got %d %q, %v; want the engine's empty 200", resp.StatusCode, got, err)
			}
		})
	}
}

func TestRequestsCannotRedirectTheSidecar(t *testing.T) {
	// A listener no request may reach: each request below names it.
	trap, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer trap.Close()
	trapped := make(chan struct{}, 8)
	go func() {
		for {
			c, err := trap.Accept()
			if err != nil {
				return
			}
			trapped <- struct{}{}
			c.Close()
		}
	}()
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	other := trap.Addr().String()
	for _, raw := range []string{
		"GET http://" + other + "/v1/models HTTP/1.1\r\nHost: " + other + "\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: " + other + "\r\n\r\n",
		"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Forwarded-Host: " + other + "\r\nForwarded: host=" + other + "\r\n\r\n",
		"GET //" + other + "/v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		resp, _ := rawExchange(t, base, raw)
		if resp.StatusCode != 200 {
			t.Errorf("%q: status %d", raw, resp.StatusCode)
		}
		engine.next(t)
	}
	noRequest(t, trapped)
}

func TestLogsCarryNoSecrets(t *testing.T) {
	const (
		key    = "sk-SECRETKEY123"
		prompt = "SECRET-PROMPT"
		output = "SECRET-OUTPUT"
	)
	engine := newScriptedEngine(t, func(c net.Conn, req *http.Request, _ []byte) {
		defer c.Close()
		if req.URL.Path == "/v1/models" {
			reset(c) // an engine failure, which the sidecar logs
			return
		}
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(tokenEvent(output))+
			chunk(`data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`+"\n\n")+"0\r\n\r\n")
	})
	var opLog, accessLog syncBuffer
	cfg := DefaultConfig()
	cfg.Upstream = engine.URL()
	p, base := serveSidecar(t, cfg, slog.New(slog.NewJSONHandler(&opLog, &slog.HandlerOptions{Level: slog.LevelDebug})), &accessLog)

	headers := map[string]string{"Authorization": "Bearer " + key, "X-Api-Key": key, "Cookie": "session=" + key}
	resp := post(t, base+"/v1/chat/completions?api_key="+key, `{"stream":true,"include_metrics":true,"messages":[{"role":"user","content":"`+prompt+`"}]}`, headers)
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(got), output) {
		t.Fatalf("the stream did not arrive: %s", got)
	}
	req, _ := http.NewRequest("GET", base+"/v1/models?api_key="+key, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
	}
	rawExchange(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+key+"\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}")
	// fasthttp logs the unparsable request after answering it: wait for
	// that line, the one most likely to quote the request.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(opLog.String(), "error when serving connection"); {
		if time.Now().After(deadline) {
			t.Fatalf("fasthttp never logged the unparsable request:\n%s", opLog.String())
		}
		time.Sleep(5 * time.Millisecond) // polling a log: there is no event to await
	}

	p.Shutdown(context.Background())
	logs := opLog.String() + accessLog.String()
	if !strings.Contains(accessLog.String(), `"path":"/v1/chat/completions"`) || !strings.Contains(opLog.String(), "upstream request failed") {
		t.Fatalf("the logs miss what they should hold:\n%s", logs)
	}
	for _, secret := range []string{key, prompt, output} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a log holds %q:\n%s", secret, logs)
		}
	}
}

// panicsCounted reads timing_sidecar_panics_total from reg.
func panicsCounted(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "timing_sidecar_panics_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no timing_sidecar_panics_total series")
	return 0
}

func TestPanicsAreContainedCountedAndLogged(t *testing.T) {
	reg := prometheus.NewRegistry()
	var log syncBuffer
	p := &Proxy{log: slog.New(slog.NewJSONHandler(&log, nil)), telemetry: telemetry.NewRecorder(reg, telemetry.Options{MaxModels: 1, MaxTenants: 1})}

	// In the handler: that request gets a 500 in OpenAI's shape.
	var ctx fasthttp.RequestCtx
	f := &flight{streaming: true, route: chatRoute}
	func() {
		defer p.recoverRequest(&ctx, f)
		panic("handler bug")
	}()
	var e errorBody
	if err := json.Unmarshal(ctx.Response.Body(), &e); err != nil || ctx.Response.StatusCode() != 500 || e.Error.Code != "sidecar_panic" {
		t.Fatalf("after a panic: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if f.streaming || f.rec.Status != 500 || !ctx.Response.ConnectionClose() {
		t.Fatalf("flight after a panic: streaming %v, status %d", f.streaming, f.rec.Status)
	}

	// In a body stream: the response is cut.
	r := newBenchRelay(event300)
	r.p = p
	r.events.Reset(panicReader{})
	if _, err := r.Read(make([]byte, 4096)); err != errPanic {
		t.Fatalf("a panic in the relay returned %v, want errPanic", err)
	}
	if n := panicsCounted(t, reg); n != 2 {
		t.Fatalf("panics counted: %v, want 2", n)
	}
	if logs := log.String(); strings.Count(logs, `"level":"ERROR"`) != 2 || !strings.Contains(logs, "goroutine ") {
		t.Fatalf("panics not logged with their stacks:\n%s", logs)
	}
}

func TestRequestHeaderTooLarge(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil) // 8 KiB, the default
	resp, body := rawExchange(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Long: "+
		strings.Repeat("a", 16<<10)+"\r\nContent-Length: 2\r\n\r\n{}")
	if resp.StatusCode != 431 || !bytes.Contains(body, []byte(`"code":"request_header_too_large"`)) {
		t.Fatalf("got %d %s, want 431 request_header_too_large", resp.StatusCode, body)
	}
	noRequest(t, engine.arrived)
}

func TestBytesPastAResponseNeverReachTheNextClient(t *testing.T) {
	const secret = "SECRET-OUTPUT of tenant A"
	var conns atomic.Int32
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		if conns.Add(1) == 1 {
			// Content-Length says 2; more follows on the kept-alive connection.
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"+secret)
			io.Copy(io.Discard, c)
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
	})
	// The leftover bytes never finish a header block.
	base, opLog := startDebugLoggedSidecar(t, engine.URL(), func(c *Config) { c.UpstreamHeaderTimeout = time.Second })
	for i, want := range []string{`{"metrics":`, `{"ok":true,"metrics":`} {
		resp := post(t, base+"/v1/chat/completions", `{"include_metrics":true}`, nil)
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(got), secret) || !strings.HasPrefix(string(got), want) {
			t.Fatalf("client %d got %d %s", i+1, resp.StatusCode, got)
		}
	}
	if strings.Contains(opLog.String(), secret) {
		t.Fatalf("the log holds another client's output:\n%s", opLog.String())
	}
}

func TestSafeErrorCutsQuotedBytes(t *testing.T) {
	for _, msg := range []string{
		`error when reading response headers: cannot find whitespace in the first line of response "SECRET-OUTPUT"`,
		`error when reading response headers: read tcp 127.0.0.1:1->127.0.0.1:2: i/o timeout: buffer size=13, contents: "SECRET-OUTPUT"`,
	} {
		if got := safeError(errors.New(msg)); strings.Contains(got, "SECRET") || !strings.HasPrefix(got, "error when reading response headers") {
			t.Errorf("safeError = %q", got)
		}
	}
	ne := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	if got := safeError(ne); got != ne.Error() {
		t.Fatalf("a network error was cut: %q", got)
	}
}

func TestUsageOnTheFinishingEvent(t *testing.T) {
	const (
		usage    = `"usage":{"completion_tokens":2,"prompt_tokens":5,"total_tokens":7}`
		llamaEnd = `data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":1,"id":"c","model":"m","object":"chat.completion.chunk",` + usage + `,"timings":{"prompt_n":5,"prompt_ms":20.5,"predicted_n":2,"predicted_ms":40.1}}` + "\n\n"
		tgiEnd   = `data: {"object":"chat.completion.chunk","id":"c","choices":[{"index":0,"delta":{"content":"!"},"finish_reason":"length"}],` + usage + "}\n\n"
		apart    = `data: {"id":"c","object":"chat.completion.chunk","choices":[],` + usage + "}\n\n"
		done     = "data: [DONE]\n\n"
	)
	for _, tt := range []struct {
		name    string
		tail    []string // events after the role and two tokens
		spliced int      // index in tail of the event that must carry the metrics; -1: none
		cut     bool     // the engine drops the connection after tail
	}{
		{"llama.cpp: on the finishing event, then [DONE]", []string{llamaEnd, done}, 0, false},
		{"on the last token event", []string{tgiEnd, done}, 0, false},
		{"no [DONE]: the end of the stream shows it", []string{llamaEnd}, 0, false},
		{"a usage event after it takes the metrics", []string{llamaEnd, apart, done}, 1, false},
		{"the engine drops after it: delivered as sent", []string{llamaEnd}, -1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
				defer c.Close()
				out := sseHead + chunk(roleEvent) + chunk(tokenEvent("a")) + chunk(tokenEvent("b"))
				for _, e := range tt.tail {
					out += chunk(e)
				}
				if !tt.cut {
					out += "0\r\n\r\n"
				}
				io.WriteString(c, out)
			})
			base := startProxy(t, engine.URL(), nil)
			resp := post(t, base+"/v1/chat/completions", `{"stream":true,"include_metrics":true,"stream_options":{"include_usage":true}}`, nil)
			events, err := readEvents(t, resp.Body)
			resp.Body.Close()
			if (err != nil && err != io.EOF) != tt.cut {
				t.Fatalf("stream ended with %v", err)
			}
			if len(events) != 3+len(tt.tail) {
				t.Fatalf("got %d events, want %d", len(events), 3+len(tt.tail))
			}
			for i, e := range tt.tail {
				got := "data: " + events[3+i].data + "\n\n"
				if i != tt.spliced {
					if got != e {
						t.Errorf("event %d changed:\n got %s\nwant %s", i, got, e)
					}
					continue
				}
				var doc map[string]json.RawMessage
				if json.Unmarshal([]byte(events[3+i].data), &doc) != nil || doc["metrics"] == nil || doc["usage"] == nil {
					t.Fatalf("no metrics in %s", got)
				}
				m := metricsOf(t, events[3+i].data)
				if m["completion_tokens"] == nil || *m["completion_tokens"] != 2 || m["time_to_first_token_ms"] == nil {
					t.Errorf("metrics %s", events[3+i].data)
				}
				delete(doc, "metrics")
				var want map[string]json.RawMessage
				json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimPrefix(e, "data: "), "\n\n")), &want)
				if !reflect.DeepEqual(doc, want) {
					t.Errorf("other keys changed: %s", got)
				}
			}
		})
	}
}

// Two events in a row that each finish their choices and carry usage (vLLM
// with n=2 and continuous_usage_stats): each goes out once, in order.
func TestTwoFinishingEventsWithUsageInARow(t *testing.T) {
	fin := func(i int) string {
		return `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":` +
			string(rune('0'+i)) + `,"delta":{"content":"x"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":` +
			string(rune('1'+i)) + `,"total_tokens":3}}` + "\n\n"
	}
	usage := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}` + "\n\n"
	engine := newScriptedEngine(t, func(c net.Conn, _ *http.Request, _ []byte) {
		defer c.Close()
		io.WriteString(c, sseHead+chunk(roleEvent)+chunk(fin(0))+chunk(fin(1))+chunk(usage)+chunk("data: [DONE]\n\n")+"0\r\n\r\n")
	})
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"stream":true,"n":2,"stream_options":{"include_usage":true,"continuous_usage_stats":true},"include_metrics":true}`, nil)
	events, _ := readEvents(t, resp.Body)
	resp.Body.Close()
	var idx []string
	for _, e := range events {
		idx = append(idx, e.data[:min(len(e.data), 130)])
	}
	if len(events) != 5 || !strings.Contains(events[1].data, `"index":0`) || !strings.Contains(events[2].data, `"index":1`) {
		t.Fatalf("events reordered or lost:\n%s", strings.Join(idx, "\n"))
	}
}

// TestHTTP10ClientsGetNoChunks: HTTP/1.0 has no chunked encoding and no
// trailers. A stream to an HTTP/1.0 client goes as it comes, ended by the
// connection's close, with the metrics in it as for any client.
func TestHTTP10ClientsGetNoChunks(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	body := `{"model":"m","stream":true,"include_metrics":true,"messages":[]}`
	resp, got := rawExchange(t, base, fmt.Sprintf("POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nTE: trailers\r\nContent-Type: application/json\r\nX-Fake-Tokens: 3\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	if len(resp.TransferEncoding) != 0 || resp.Header.Get("Trailer") != "" || !resp.Close {
		t.Fatalf("an HTTP/1.0 client got Transfer-Encoding %v, Trailer %q, close %v", resp.TransferEncoding, resp.Header.Get("Trailer"), resp.Close)
	}
	s := string(got)
	if !strings.HasPrefix(s, "data: ") || !strings.HasSuffix(s, "data: [DONE]\n\n") || !strings.Contains(s, `"metrics":{`) {
		t.Fatalf("want the events as the engine sent them, with the metrics:\n%s", s)
	}
}

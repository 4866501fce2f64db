package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/timing-sidecar/timing-sidecar/e2e/emulator"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// syncBuffer is a log the test can read while the proxy writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) lines() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Split(strings.TrimSpace(b.buf.String()), "\n")
}

// series finds one series of a gathered family by its labels; labels
// that name no leg mean the whole request's.
func series(t *testing.T, p *Proxy, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := p.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if _, named := labels["leg"]; !named && got["leg"] == "whole" {
				delete(got, "leg")
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if len(got) == len(labels) {
				return m
			}
		}
	}
	return nil
}

// uncached is labels with the TTFT histogram's cache class of an engine
// that does not report its cache.
func uncached(labels map[string]string) map[string]string {
	l := map[string]string{"cache": "unknown"}
	for k, v := range labels {
		l[k] = v
	}
	return l
}

func counterValue(t *testing.T, p *Proxy, name string, labels map[string]string) float64 {
	t.Helper()
	if m := series(t, p, name, labels); m != nil {
		return m.GetCounter().GetValue()
	}
	return 0
}

func histogramCount(t *testing.T, p *Proxy, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	if m := series(t, p, name, labels); m != nil {
		return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
	}
	return 0, 0
}

// TestMixedLoadIsCountedAndLogged sends streaming and non-streaming,
// opted-in and not, failing and unmeasured requests, then checks that the
// series and the access log agree with what was sent.
func TestMixedLoadIsCountedAndLogged(t *testing.T) {
	engine := newFakeEngine(t)
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), nil, &log)
	type call struct {
		path, body string
		headers    map[string]string
	}
	slow := map[string]string{"X-Fake-Header-Delay": "20", "X-Fake-TTFT": "30", "X-Fake-ITL": "20", "Authorization": "Bearer sk-secret"}
	calls := []call{
		{"/v1/chat/completions", `{"model":"a","stream":true,"include_metrics":true,"messages":[{"role":"user","content":"PROMPT-TEXT"}]}`, slow},
		{"/v1/chat/completions", `{"model":"a","stream":true,"include_metrics":true}`, slow},
		{"/v1/chat/completions", `{"model":"a","stream":true,"include_metrics":true}`, slow},
		{"/v1/chat/completions", `{"model":"b","stream":true}`, nil},
		{"/v1/chat/completions", `{"model":"b","stream":true}`, nil},
		{"/v1/completions", `{"model":"a","prompt":"x","include_metrics":true}`, nil},
		{"/v1/completions", `{"model":"a","prompt":"x","include_metrics":true}`, nil},
		{"/v1/chat/completions", `{"model":"b"}`, nil},
		{"/v1/chat/completions", `{"model":"a","stream":true}`, map[string]string{"X-Fake-Status": "400"}},
	}
	// Causal bounds on the sum of the model a streams' TTFT from arrival:
	// each lies between the engine's receiving the request and writing
	// the first token, and the client's whole exchange.
	var ttftLo, ttftHi time.Duration
	for _, c := range calls {
		start := time.Now()
		resp := post(t, base+c.path, c.body, c.headers)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		end := time.Now()
		fr := engine.next(t)
		<-fr.Finished
		if strings.Contains(c.body, `"model":"a","stream":true,"include`) {
			ttftLo += fr.FirstToken.Sub(fr.Received)
			ttftHi += end.Sub(start)
		}
	}
	resp, err := client.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	engine.next(t)

	checkMixedLoadSeries(t, p, ttftLo, ttftHi)
	p.telemetry.Flush() // the access log is written in batches
	checkMixedLoadAccessLog(t, log.lines(), len(calls)+1)
}

// checkMixedLoadSeries checks the series TestMixedLoadIsCountedAndLogged's
// requests left: counts by label, the model a streams' summed TTFT within
// [ttftLo, ttftHi], the token counters and the in-flight gauge.
func checkMixedLoadSeries(t *testing.T, p *Proxy, ttftLo, ttftHi time.Duration) {
	t.Helper()
	requests := map[[4]string]float64{
		{"chat_completions", "true", "200", "a"}:  3,
		{"chat_completions", "true", "200", "b"}:  2,
		{"completions", "false", "200", "a"}:      2,
		{"chat_completions", "false", "200", "b"}: 1,
		{"chat_completions", "true", "400", "a"}:  1,
		{"other", "false", "200", ""}:             1,
	}
	for l, want := range requests {
		labels := map[string]string{"endpoint": l[0], "stream": l[1], "status": l[2], "model": l[3]}
		if got := counterValue(t, p, "timing_sidecar_requests_total", labels); got != want {
			t.Errorf("requests_total%v = %v, want %v", labels, got, want)
		}
	}
	chatA := map[string]string{"endpoint": "chat_completions", "model": "a"}
	chatB := map[string]string{"endpoint": "chat_completions", "model": "b"}
	cmplA := map[string]string{"endpoint": "completions", "model": "a"}
	for _, h := range []struct {
		name   string
		labels map[string]string
		want   uint64
	}{
		{"timing_sidecar_time_to_first_token_seconds", uncached(chatA), 3},
		{"timing_sidecar_time_to_first_token_seconds", uncached(chatB), 2}, // not opted in: measured all the same
		{"timing_sidecar_time_to_first_token_seconds", uncached(cmplA), 0}, // non-streaming: no first token to see
		{"timing_sidecar_e2e_request_latency_seconds", chatB, 3},
		{"timing_sidecar_e2e_request_latency_seconds", cmplA, 2},
		{"timing_sidecar_queue_time_seconds", chatA, 3},
		{"timing_sidecar_inter_token_latency_seconds", chatA, 3},
		{"timing_sidecar_max_inter_token_latency_seconds", chatA, 3},
	} {
		if got, _ := histogramCount(t, p, h.name, h.labels); got != h.want {
			t.Errorf("%s%v count = %d, want %d", h.name, h.labels, got, h.want)
		}
	}
	// TTFT from arrival, summed over the three streams.
	if _, sum := histogramCount(t, p, "timing_sidecar_time_to_first_token_seconds", uncached(chatA)); sum < ttftLo.Seconds()-1e-6 || sum > ttftHi.Seconds()+1e-6 {
		t.Errorf("TTFT sum %.4fs, want between %.4fs and %.4fs", sum, ttftLo.Seconds(), ttftHi.Seconds())
	}
	// Token counts: the fake engine reports 7 prompt and 4 generated
	// tokens; the model b streams did not ask for usage but are counted.
	if got := counterValue(t, p, "timing_sidecar_generation_tokens_total", chatB); got != 12 {
		t.Errorf("generation tokens for b = %v, want 12 (two streams with hidden usage, one unary)", got)
	}
	if got := counterValue(t, p, "timing_sidecar_prompt_tokens_total", chatA); got != 21 {
		t.Errorf("prompt tokens for a = %v, want 21", got)
	}
	if m := series(t, p, "timing_sidecar_in_flight_requests", map[string]string{}); m.GetGauge().GetValue() != 0 {
		t.Errorf("in flight = %v after all requests ended", m.GetGauge().GetValue())
	}
}

// checkMixedLoadAccessLog checks the access log's lines for
// TestMixedLoadIsCountedAndLogged's requests: one JSON line each with
// every field and its own request id, no prompt, output or credential,
// and the first request's figures.
func checkMixedLoadAccessLog(t *testing.T, lines []string, requests int) {
	t.Helper()
	if len(lines) != requests {
		t.Fatalf("%d access-log lines for %d requests:\n%s", len(lines), requests, strings.Join(lines, "\n"))
	}
	ids := map[string]bool{}
	for i, l := range lines {
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %d is not JSON: %s", i, l)
		}
		if id, _ := e["request_id"].(string); id == "" || ids[id] {
			t.Errorf("line %d: request id %q missing or repeated", i, e["request_id"])
		} else {
			ids[id] = true
		}
		for _, k := range []string{"time", "method", "path", "model", "stream", "status", "time_to_first_token_ms",
			"e2e_latency_ms", "prompt_tokens", "completion_tokens", "bytes_in", "bytes_out", "upstream_error", "tenant"} {
			if _, ok := e[k]; !ok {
				t.Errorf("line %d lacks %s: %s", i, k, l)
			}
		}
	}
	if all := strings.Join(lines, "\n"); strings.Contains(all, "PROMPT-TEXT") || strings.Contains(all, "sk-secret") || strings.Contains(all, " t0") {
		t.Errorf("the access log holds a prompt, output or credential:\n%s", all)
	}
	var first map[string]any
	json.Unmarshal([]byte(lines[0]), &first)
	if first["status"] != 200.0 || first["model"] != "a" || first["stream"] != true || first["prompt_tokens"] != 7.0 || first["time_to_first_token_ms"] == nil {
		t.Errorf("first line %s", lines[0])
	}
}

func TestRequestIDIsForwardedAndReturned(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), nil)
	resp := post(t, base+"/v1/chat/completions", `{"model":"m"}`, map[string]string{"X-Request-Id": "client-chosen"})
	resp.Body.Close()
	if fr := engine.next(t); fr.Header.Get("X-Request-Id") != "client-chosen" || resp.Header.Get("X-Request-Id") != "client-chosen" {
		t.Errorf("engine got %q, client got %q", fr.Header.Get("X-Request-Id"), resp.Header.Get("X-Request-Id"))
	}
	resp = post(t, base+"/v1/chat/completions", `{"model":"m","stream":true}`, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	fr := engine.next(t)
	id := resp.Header.Get("X-Request-Id")
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) || fr.Header.Get("X-Request-Id") != id {
		t.Errorf("made-up id: client got %q, engine got %q", id, fr.Header.Get("X-Request-Id"))
	}
}

func TestServerTiming(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), func(c *Config) { c.Mode = rewrite.ModeOptIn })
	resp := post(t, base+"/v1/chat/completions", `{"include_metrics":true}`, map[string]string{"X-Fake-TTFT": "30"})
	resp.Body.Close()
	if st := resp.Header.Get("Server-Timing"); !regexp.MustCompile(`^e2e;dur=\d+\.\d{3}$`).MatchString(st) {
		t.Errorf("non-streaming Server-Timing = %q", st)
	}
	resp = post(t, base+"/v1/chat/completions", `{"model":"m"}`, nil)
	resp.Body.Close()
	if st := resp.Header.Get("Server-Timing"); st != "" {
		t.Errorf("Server-Timing %q on a response without metrics", st)
	}

	// A stream whose client accepts trailers gets the figures at the end.
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"stream":true,"include_metrics":true}`
	io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nX-Fake-TTFT: 20\r\nX-Fake-ITL: 20\r\nContent-Length: "+
		itoa(len(body))+"\r\n\r\n"+body)
	sresp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, sresp.Body)
	st := sresp.Trailer.Get("Server-Timing")
	if !regexp.MustCompile(`^queue;dur=\d+\.\d{3}, ttft;dur=\d+\.\d{3}, gen;dur=\d+\.\d{3}, e2e;dur=\d+\.\d{3}$`).MatchString(st) {
		t.Errorf("stream Server-Timing trailer = %q (trailers %v)", st, sresp.Trailer)
	}
}

// TestServerTimingKeepsTheEngines: Server-Timing is a list; the engine's
// entries (several, on several field lines) reach the client as the
// engine sent them, and the sidecar's come after them: in the header of a
// body, and in the trailer of a stream, which then carries the engine's
// too (a field is a header or a trailer of a message, by its name).
func TestServerTimingKeepsTheEngines(t *testing.T) {
	engine := newFakeEngine(t)
	base := startProxy(t, engine.URL(), func(c *Config) { c.UpgradeNonStreaming = true })
	engineTiming := []string{`cache;desc="prefix hit", db;dur=2.5`, "gw;dur=0.4"}
	fields := func(h http.Header) []string {
		var all []string
		for _, v := range h.Values("Server-Timing") {
			for e := range strings.SplitSeq(v, ",") {
				all = append(all, strings.TrimSpace(e))
			}
		}
		return all
	}
	ours := regexp.MustCompile(`^(queue|ttft|gen|e2e);dur=\d+\.\d{3}$`)
	// The field as a client reads it: the header's lines, then the
	// trailer's (RFC 9110 6.5.1).
	check := func(what string, header, trailer http.Header) {
		t.Helper()
		got := append(fields(header), fields(trailer)...)
		if len(got) < 3 || strings.Join(got[:3], ", ") != `cache;desc="prefix hit", db;dur=2.5, gw;dur=0.4` {
			t.Fatalf("%s: the engine's entries do not come first: %q", what, got)
		}
		if len(got) == 3 {
			t.Fatalf("%s: no sidecar entries (header %q, trailer %q)", what, header, trailer)
		}
		for _, e := range got[3:] {
			if !ours.MatchString(e) {
				t.Fatalf("%s: %q is not the sidecar's", what, e)
			}
		}
	}
	headers := map[string]string{"X-Fake-TTFT": "5"}
	// A body read whole, and one the sidecar upgrades to a stream and
	// reassembles.
	for _, body := range []string{`{"include_metrics":true,"not_upgradable":1}`, `{"include_metrics":true,"model":"m","messages":[]}`} {
		req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		for _, v := range engineTiming {
			req.Header.Add("X-Fake-Server-Timing", v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		check(body, resp.Header, nil)
	}

	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"stream":true,"include_metrics":true}`
	io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n"+
		"X-Fake-Server-Timing: "+engineTiming[0]+"\r\nX-Fake-Server-Timing: "+engineTiming[1]+"\r\n"+
		"Content-Length: "+itoa(len(body))+"\r\n\r\n"+body)
	sresp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, sresp.Body)
	check("stream", sresp.Header, sresp.Trailer)
	for _, e := range fields(sresp.Header) {
		if ours.MatchString(e) {
			t.Fatalf("stream: the sidecar's %q in the header, before the figures were known", e)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func TestTenantLabel(t *testing.T) {
	engine := newFakeEngine(t)
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) {
		c.TenantHeader, c.TenantLabel, c.MaxTenantLabels = "X-Tenant-Id", true, 1
	}, &log)
	for _, tenant := range []string{"acme", "globex", "acme"} {
		resp := post(t, base+"/v1/chat/completions", `{"model":"m"}`, map[string]string{"X-Tenant-Id": tenant})
		resp.Body.Close()
	}
	for labels, want := range map[string]float64{"acme": 2, "other": 1} {
		got := counterValue(t, p, "timing_sidecar_requests_total",
			map[string]string{"endpoint": "chat_completions", "stream": "false", "status": "200", "model": "m", "tenant": labels})
		if got != want {
			t.Errorf("tenant %s: %v requests, want %v", labels, got, want)
		}
	}
	p.telemetry.Flush()
	if !strings.Contains(log.lines()[1], `"tenant":"globex"`) {
		t.Errorf("access log lacks the tenant: %s", log.lines()[1])
	}
}

// TestVariant: a request's arm is its variant header's value, else the
// deployment's (--variant), in the series and the access log; a header
// value takes a label slot only with a 2xx answer, and past the bound
// counts as "other"; without variants configured no series has the label.
func TestVariant(t *testing.T) {
	type call struct {
		header string // X-Variant's value; empty: not sent
		status int    // the engine's answer
	}
	for _, tc := range []struct {
		name         string
		flag, header string
		max          int
		calls        []call
		logged       []string           // each line's variant
		series       map[string]float64 // requests by variant label; nil: no label
	}{
		{name: "off", header: "", max: 8, calls: []call{{"canary", 200}},
			logged: []string{""}},
		{name: "the deployment's arm", flag: "stable", max: 8, calls: []call{{"", 200}, {"canary", 200}},
			logged: []string{"stable", "stable"}, series: map[string]float64{"stable": 2}},
		{name: "the header wins", flag: "stable", header: "X-Variant", max: 8, calls: []call{{"canary", 200}, {"", 200}},
			logged: []string{"canary", "stable"}, series: map[string]float64{"canary": 1, "stable": 1}},
		{name: "the header alone", header: "X-Variant", max: 8, calls: []call{{"canary", 200}, {"", 200}},
			logged: []string{"canary", ""}, series: map[string]float64{"canary": 1, "": 1}},
		{name: "a 4xx takes no slot", flag: "stable", header: "X-Variant", max: 2, calls: []call{{"junk", 404}, {"canary", 200}, {"junk", 404}},
			logged: []string{"junk", "canary", "junk"}, series: map[string]float64{"other": 2, "canary": 1}},
		{name: "past the bound", flag: "stable", header: "X-Variant", max: 2, calls: []call{{"canary", 200}, {"third", 200}, {"stable", 200}},
			logged: []string{"canary", "third", "stable"}, series: map[string]float64{"canary": 1, "other": 1, "stable": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			engine := newFakeEngine(t)
			var log syncBuffer
			p, base := startSidecar(t, engine.URL(), func(c *Config) {
				c.Variant, c.VariantHeader, c.MaxVariantLabels = tc.flag, tc.header, tc.max
			}, &log)
			for _, c := range tc.calls {
				h := map[string]string{"X-Fake-Status": strconv.Itoa(c.status)}
				if c.header != "" {
					h["X-Variant"] = c.header
				}
				resp := post(t, base+"/v1/chat/completions", `{"model":"m"}`, h)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			p.telemetry.Flush()
			lines := log.lines()
			for i, want := range tc.logged {
				var line map[string]any
				if i >= len(lines) || json.Unmarshal([]byte(lines[i]), &line) != nil || line["variant"] != want {
					t.Errorf("access-log line %d: variant %v, want %q", i, line["variant"], want)
				}
			}
			if got := requestsBy(t, p, "variant"); !maps.Equal(got, tc.series) {
				t.Errorf("requests by variant %v, want %v", got, tc.series)
			}
		})
	}
}

// requestsBy sums timing_sidecar_requests_total by one of its labels; nil
// when no series has the label.
func requestsBy(t *testing.T, p *Proxy, label string) map[string]float64 {
	t.Helper()
	mfs, err := p.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]float64
	for _, mf := range mfs {
		if mf.GetName() != "timing_sidecar_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label {
					if out == nil {
						out = map[string]float64{}
					}
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// eventually polls cond until it holds or the deadline passes: readiness
// is a cached probe result with no event to wait on.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	// Only how long a failure takes to be reported: far past what the
	// slowest machine running the whole suite beside two busy loops needs.
	const within = 30 * time.Second
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReadinessFollowsTheEngine(t *testing.T) {
	for _, probe := range []string{ProbeHTTP, ProbeTCP} {
		t.Run(probe, func(t *testing.T) {
			engine := newFakeEngine(t)
			p, _ := startSidecar(t, engine.URL(), func(c *Config) {
				c.ReadinessProbe, c.ReadinessInterval = probe, 20*time.Millisecond
			}, nil)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go p.ServeAdmin(ln)
			status := func(path string) int {
				rec := httptest.NewRecorder()
				p.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
				return rec.Code
			}
			eventually(t, "ready while the engine answers", func() bool { return status("/readyz") == 200 })
			if status("/healthz") != 200 {
				t.Error("healthz not 200")
			}
			metrics := httptest.NewRecorder()
			p.AdminHandler().ServeHTTP(metrics, httptest.NewRequest("GET", "/metrics", nil))
			if !strings.Contains(metrics.Body.String(), "timing_sidecar_in_flight_requests") {
				t.Error("/metrics lacks the sidecar's series")
			}
			engine.srv.Close()
			eventually(t, "not ready once the engine is down", func() bool { return status("/readyz") == 503 })
			if status("/healthz") != 200 {
				t.Error("healthz failed with the engine down; it must only say the process is up")
			}
		})
	}
}

func TestReadinessFailsWhileShuttingDown(t *testing.T) {
	engine := newFakeEngine(t)
	p, _ := startSidecar(t, engine.URL(), func(c *Config) { c.ReadinessInterval = 20 * time.Millisecond }, nil)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go p.ServeAdmin(ln)
	rec := func() *httptest.ResponseRecorder {
		r := httptest.NewRecorder()
		p.AdminHandler().ServeHTTP(r, httptest.NewRequest("GET", "/readyz", nil))
		return r
	}
	eventually(t, "ready", func() bool { return rec().Code == 200 })
	p.ready.stopping.Store(true)
	if r := rec(); r.Code != 503 || !strings.Contains(r.Body.String(), "shutting down") {
		t.Fatalf("readyz while shutting down: %d %s", r.Code, r.Body.String())
	}
}

// TestDrainClosesKeepAliveConnections: from SIGTERM on, a connection idle
// between requests is closed at once, one in use right after its response,
// and every new response says Connection: close, so that clients reconnect
// to where the load balancer now sends them instead of racing the close of
// an idle connection when the drain ends.
func TestDrainClosesKeepAliveConnections(t *testing.T) {
	engine := newFakeEngine(t)
	p, base := startSidecar(t, engine.URL(), nil, nil)
	addr := strings.TrimPrefix(base, "http://")
	request := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: 13\r\n\r\n{\"model\":\"m\"}"
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a hang fails, not stalls
		return c, bufio.NewReader(c)
	}
	closedAfter := func(name string, r *bufio.Reader) {
		t.Helper()
		if _, err := r.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s connection: %v, want it closed by the sidecar", name, err)
		}
	}

	idle, idleR := dial()
	fmt.Fprintf(idle, request, "")
	resp, err := http.ReadResponse(idleR, nil)
	if err != nil || resp.Close {
		t.Fatalf("before the drain: %v, close %v", err, resp != nil && resp.Close)
	}
	io.Copy(io.Discard, resp.Body)
	engine.next(t)

	busy, busyR := dial()
	fmt.Fprintf(busy, request, "X-Fake-Header-Delay: 300\r\n")
	engine.next(t) // in the engine when the drain begins

	p.drain()
	closedAfter("idle", idleR)
	resp, err = http.ReadResponse(busyR, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the request in flight: %v", err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("the request in flight lost its body: %v", err)
	}
	closedAfter("in-use", busyR)

	fresh, freshR := dial()
	fmt.Fprintf(fresh, request, "")
	resp, err = http.ReadResponse(freshR, nil)
	if err != nil || resp.StatusCode != 200 || !resp.Close {
		t.Fatalf("a new connection during the drain: %v, want served with Connection: close", err)
	}
}

// TestRequestsCarryTheirOwnObjectives: a request's objective headers
// decide its verdict alone, reach the engine unchanged, and one that
// holds no objective leaves the flags' in force and is counted. The
// objectives are chosen so no verdict depends on how fast the machine is:
// a microsecond cannot be met, an hour cannot be missed.
func TestRequestsCarryTheirOwnObjectives(t *testing.T) {
	engine := newFakeEngine(t)
	var log syncBuffer
	p, base := startSidecar(t, engine.URL(), func(c *Config) {
		c.SLOTTFT, c.SLOITL = time.Hour, time.Hour
	}, &log)
	body := `{"model":"m","stream":true}`
	gaps := map[string]string{"X-Fake-ITL": "5"} // token events apart: a mean ITL above 1 µs
	for _, tc := range []struct {
		headers    map[string]string
		slo        string
		objectives string
	}{
		{nil, "met", "flags"},
		{map[string]string{"x-llm-d-slo-ttft-ms": "0.001"}, "missed", "request"},
		{map[string]string{"x-llm-d-slo-tpot-ms": "0.001"}, "missed", "request"},
		{map[string]string{"x-llm-d-slo-ttft-ms": "3600000", "x-llm-d-slo-tpot-ms": "3600000"}, "met", "request"},
		{map[string]string{"x-llm-d-slo-ttft-ms": "soon", "x-llm-d-slo-tpot-ms": "-5"}, "met", "flags"},
	} {
		h := map[string]string{}
		for k, v := range gaps {
			h[k] = v
		}
		for k, v := range tc.headers {
			h[k] = v
		}
		resp := post(t, base+"/v1/chat/completions", body, h)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%v: status %d", tc.headers, resp.StatusCode)
		}
		fr := engine.next(t)
		<-fr.Finished
		for k, v := range tc.headers {
			if got := fr.Header.Get(k); got != v {
				t.Errorf("the engine got %s: %q, want %q as sent", k, got, v)
			}
		}
	}
	p.telemetry.Flush()
	lines := log.lines()
	if len(lines) != 5 {
		t.Fatalf("%d access-log lines", len(lines))
	}
	want := [][2]string{{"met", "flags"}, {"missed", "request"}, {"missed", "request"}, {"met", "request"}, {"met", "flags"}}
	for i, l := range lines {
		var e struct {
			SLO        string `json:"slo"`
			Objectives string `json:"slo_objectives"`
		}
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatal(err)
		}
		if got := [2]string{e.SLO, e.Objectives}; got != want[i] {
			t.Errorf("request %d: slo %q by %q, want %q", i, got[0], got[1], want[i])
		}
	}
	for labels, n := range map[[2]string]float64{{"met", "flags"}: 2, {"missed", "request"}: 2, {"met", "request"}: 1} {
		l := map[string]string{"endpoint": "chat_completions", "model": "m", "result": labels[0], "objectives": labels[1]}
		if got := counterValue(t, p, "timing_sidecar_slo_requests_total", l); got != n {
			t.Errorf("slo_requests_total%v = %v, want %v", l, got, n)
		}
	}
	for _, o := range []string{"ttft", "itl"} {
		if got := counterValue(t, p, "timing_sidecar_invalid_objectives_total", map[string]string{"objective": o}); got != 1 {
			t.Errorf("invalid %s objectives = %v, want 1", o, got)
		}
	}
}

// TestARefusalIsAFailureWithItsDuration: a request the sidecar refuses
// before its handler (a 413 to Expect: 100-continue) is a failure in the
// GenAI metrics, with a duration from its arrival: recorded before its
// answer went out, so no longer than its client waited.
func TestARefusalIsAFailureWithItsDuration(t *testing.T) {
	engine := newFakeEngine(t)
	reader := sdkmetric.NewManualReader()
	base := startProxy(t, engine.URL(), func(c *Config) { c.MaxRequestBodySize, c.OTLP.MetricReader = 1<<20, reader })
	sent := time.Now()
	c := rawRequest(t, base, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: "+itoa(20<<20)+"\r\n\r\n")
	c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // a hang fails, not stalls
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	waited := time.Since(sent)
	if err != nil || resp.StatusCode != 413 {
		t.Fatalf("got %v %v, want the 413", resp, err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var count uint64
	var sum float64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "gen_ai.server.request.duration" {
				continue
			}
			for _, p := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				if v, _ := p.Attributes.Value("error.type"); v.AsString() == "413" {
					count, sum = count+p.Count, sum+p.Sum
				}
			}
		}
	}
	if count != 1 || sum <= 0 || sum > waited.Seconds() {
		t.Errorf("request durations with error.type 413: %d, summing to %v s; want 1, within the %v the client waited", count, sum, waited)
	}
}

// TestAnErrorInsideAStreamIsAFailure: an engine that answers 200 and then
// reports a failure in the stream (llama.cpp does, for output it cannot
// parse) has failed the request: stream_error in the access log and the
// failures counter, streamed or upgraded to one answer; the client gets
// the engine's bytes as they were.
func TestAnErrorInsideAStreamIsAFailure(t *testing.T) {
	engine := startEmulator(t, emulator.Config{Timing: emulator.Timing{OutputTokens: 6}})
	for _, c := range []struct {
		name    string
		stream  bool
		upgrade bool
	}{{"streamed", true, false}, {"upgraded", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			var log syncBuffer
			p, base := startSidecar(t, engine.URL(), func(cfg *Config) { cfg.UpgradeNonStreaming = c.upgrade }, &log)
			body := fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, c.stream)
			resp := post(t, base+"/v1/chat/completions", body, map[string]string{emulator.HeaderErrorAfter: "2"})
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(raw), "emulated engine failure") {
				t.Fatalf("the engine's error did not reach the client: %d %s", resp.StatusCode, raw)
			}
			p.telemetry.Flush()
			lines := log.lines()
			if len(lines) != 1 || !strings.Contains(lines[0], `"upstream_error":"stream_error"`) {
				t.Errorf("access log: %v", lines)
			}
			if n := counterValue(t, p, "timing_sidecar_upstream_errors_total", map[string]string{"kind": telemetry.ErrorStream}); n != 1 {
				t.Errorf("stream_error counted %v times", n)
			}
		})
	}
}

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// The tracing tests send spans to a real Jaeger: the jaeger binary of the
// version e2e/jaeger/go.mod names as a tool (a module of its own, so its
// dependencies stay out of the product's), built on first use into the
// user's cache directory, started on free loopback ports with in-memory
// storage, and read back through its own query API.

const jaegerVersion = "v1.75.0"

var jaegerBuild = &cachedBuild{name: "jaeger", version: jaegerVersion, module: "jaeger", pkg: "github.com/jaegertracing/jaeger/cmd/jaeger"}

// buildJaeger builds the jaeger binary unless the cache has it. The first
// build on a clean machine downloads and compiles a few hundred modules:
// minutes, so TestMain starts it in the background, beside the tests that
// do not need it.
func buildJaeger() (string, error) { return jaegerBuild.get() }

// jaeger is a running Jaeger: OTLP receivers, the query API, and the
// metrics it received exposed for a scrape (a metrics pipeline from the
// otlp receiver to the prometheus exporter: Jaeger v2 is an OpenTelemetry
// Collector distribution).
type jaeger struct {
	grpc, http, query, metrics string // host:port
}

// freePorts reserves n loopback ports and frees them for the caller.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return addrs
}

const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [jaeger_storage_exporter]
    metrics:
      receivers: [otlp]
      exporters: [prometheus]
  telemetry:
    metrics:
      level: none
    traces:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: %s
    grpc:
      endpoint: %s
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
  prometheus:
    endpoint: %s
`

// startJaeger runs Jaeger for one test and waits until it accepts spans
// and queries.
func startJaeger(t *testing.T) *jaeger {
	t.Helper()
	path, err := buildJaeger()
	if err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 5)
	j := &jaeger{grpc: ports[0], http: ports[1], query: ports[2], metrics: ports[4]}
	config := filepath.Join(t.TempDir(), "jaeger.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, jaegerConfig, j.query, ports[3], j.grpc, j.http, j.metrics), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, "--config", "file:"+config)
	// Jaeger would trace itself to the default collector address.
	cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none")
	startBackend(t, "jaeger", cmd, func() bool {
		return listening(j.grpc, j.http) && answers200("http://"+j.query+"/api/services") && answers200("http://"+j.metrics+"/metrics")
	})
	return j
}

// jaegerTrace is a trace as Jaeger's query API returns it.
type jaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []jaegerSpan             `json:"spans"`
	Processes map[string]jaegerProcess `json:"processes"`
}

type jaegerProcess struct {
	ServiceName string      `json:"serviceName"`
	Tags        []jaegerTag `json:"tags"`
}

type jaegerSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	ProcessID string      `json:"processID"`
	StartTime int64       `json:"startTime"` // µs since the epoch
	Duration  int64       `json:"duration"`  // µs
	Tags      []jaegerTag `json:"tags"`
	Logs      []struct {
		Timestamp int64       `json:"timestamp"`
		Fields    []jaegerTag `json:"fields"`
	} `json:"logs"`
}

type jaegerTag struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// tag returns a span's tag value, nil if it has none.
func (s jaegerSpan) tag(key string) any {
	for _, tg := range s.Tags {
		if tg.Key == key {
			return tg.Value
		}
	}
	return nil
}

// event returns when the span's event name happened, in µs since the
// epoch, or 0.
func (s jaegerSpan) event(name string) int64 {
	for _, l := range s.Logs {
		for _, f := range l.Fields {
			if f.Key == "event" && f.Value == name {
				return l.Timestamp
			}
		}
	}
	return 0
}

func (s jaegerSpan) parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// get reads a query API path into v; it returns the raw body too.
func (j *jaeger) get(t *testing.T, path string, v any) string {
	t.Helper()
	resp, err := http.Get("http://" + j.query + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&raw); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return string(raw)
}

// spanCount is how many spans of trace id Jaeger holds (0 if none).
func (j *jaeger) trace(t *testing.T, id string) jaegerTrace {
	t.Helper()
	var out struct {
		Data []jaegerTrace `json:"data"`
	}
	resp, err := http.Get("http://" + j.query + "/api/traces/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return jaegerTrace{}
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if len(out.Data) == 0 {
		return jaegerTrace{}
	}
	return out.Data[0]
}

// awaitTrace polls until trace id has at least spans spans (export is
// asynchronous by design: a request never waits on it).
func (j *jaeger) awaitTrace(t *testing.T, id string, spans int) jaegerTrace {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		tr := j.trace(t, id)
		if len(tr.Spans) >= spans {
			return tr
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s has %d spans in Jaeger after 20s, want %d", id, len(tr.Spans), spans)
		}
		time.Sleep(50 * time.Millisecond) // polling the backend, which has no event to await
	}
}

// awaitRequest polls until Jaeger has the SERVER span of the request with
// X-Request-Id id, sent by service, and returns its trace.
func (j *jaeger) awaitRequest(t *testing.T, service, id string) jaegerTrace {
	t.Helper()
	q := url.Values{"service": {service}, "tags": {`{"gen_ai.request.id":"` + id + `"}`}, "lookback": {"1h"}, "limit": {"10"}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		var out struct {
			Data []jaegerTrace `json:"data"`
		}
		j.get(t, "/api/traces?"+q.Encode(), &out)
		if len(out.Data) > 0 {
			return j.awaitTrace(t, out.Data[0].TraceID, 2)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no trace of request %s from %s in Jaeger after 20s", id, service)
		}
		time.Sleep(50 * time.Millisecond) // polling the backend, which has no event to await
	}
}

// serverAndClient picks a trace's sidecar SERVER and CLIENT spans.
func serverAndClient(t *testing.T, tr jaegerTrace) (server, client jaegerSpan) {
	t.Helper()
	for _, s := range tr.Spans {
		switch s.tag("span.kind") {
		case "server":
			server = s
		case "client":
			client = s
		}
	}
	if server.SpanID == "" || client.SpanID == "" {
		t.Fatalf("trace %s: no SERVER and CLIENT span pair among %d spans", tr.TraceID, len(tr.Spans))
	}
	return server, client
}

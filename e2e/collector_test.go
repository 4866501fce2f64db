package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/timing-sidecar/timing-sidecar/e2e/needs"
)

// The tracing, GenAI metrics and usage records tests send OTLP to a real
// OpenTelemetry Collector: e2e/otelcol (a module of its own, so its
// dependencies stay out of the product's), with only the otlp receiver and
// the file exporter, built on first use into the user's cache directory
// (needs.Collector) and started on free loopback ports. It writes what arrives to a file per signal, one OTLP/JSON
// export request a line, and the tests read those files.

// collector is a running collector: its OTLP receivers and the files its
// file exporters write.
type collector struct {
	grpc, http            string // host:port
	traces, metrics, logs string // paths
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

// collectorConfig has no service.telemetry section: the collector's own
// telemetry takes no settings (e2e/otelcol/main.go). The file exporter
// buffers, and flushes every 100 ms.
const collectorConfig = `receivers:
  otlp:
    protocols:
      grpc: {endpoint: %s}
      http: {endpoint: %s}
exporters:
  file/traces: {path: %q, format: json, flush_interval: 100ms}
  file/metrics: {path: %q, format: json, flush_interval: 100ms}
  file/logs: {path: %q, format: json, flush_interval: 100ms}
service:
  pipelines:
    traces: {receivers: [otlp], exporters: [file/traces]}
    metrics: {receivers: [otlp], exporters: [file/metrics]}
    logs: {receivers: [otlp], exporters: [file/logs]}
`

// startCollector runs the collector for one test and waits until both
// receivers listen.
func startCollector(t *testing.T) *collector {
	t.Helper()
	path, err := needs.Collector.Path()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ports := freePorts(t, 2)
	c := &collector{grpc: ports[0], http: ports[1], traces: filepath.Join(dir, "traces.jsonl"), metrics: filepath.Join(dir, "metrics.jsonl"),
		logs: filepath.Join(dir, "logs.jsonl")}
	config := filepath.Join(dir, "otelcol.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, collectorConfig, c.grpc, c.http, c.traces, c.metrics, c.logs), 0o644); err != nil {
		t.Fatal(err)
	}
	startBackend(t, "otelcol", exec.Command(path, "--config", "file:"+config), func() bool { return listening(c.grpc, c.http) })
	return c
}

// lines reads the export requests in one of the collector's files. A line
// whose end is not flushed yet is left for the next read.
func lines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b = b[:bytes.LastIndexByte(b, '\n')+1]
	if len(b) == 0 {
		return nil
	}
	return bytes.Split(b[:len(b)-1], []byte("\n"))
}

// attributes is an OTLP attribute list as Go values: string, int64,
// float64, bool, or []any of those.
type attributes map[string]any

func (a *attributes) UnmarshalJSON(b []byte) error {
	var kvs []struct {
		Key   string          `json:"key"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(b, &kvs); err != nil {
		return err
	}
	*a = attributes{}
	for _, kv := range kvs {
		v, err := anyValue(kv.Value)
		if err != nil {
			return fmt.Errorf("attribute %s: %w", kv.Key, err)
		}
		(*a)[kv.Key] = v
	}
	return nil
}

// anyValue decodes an OTLP/JSON AnyValue: one field named for its type,
// 64-bit integers as strings.
func anyValue(raw json.RawMessage) (any, error) {
	var v struct {
		String *string  `json:"stringValue"`
		Bool   *bool    `json:"boolValue"`
		Int    *string  `json:"intValue"`
		Double *float64 `json:"doubleValue"`
		Array  *struct {
			Values []json.RawMessage `json:"values"`
		} `json:"arrayValue"`
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	switch {
	case v.String != nil:
		return *v.String, nil
	case v.Bool != nil:
		return *v.Bool, nil
	case v.Int != nil:
		return strconv.ParseInt(*v.Int, 10, 64)
	case v.Double != nil:
		return *v.Double, nil
	case v.Array != nil:
		values := []any{}
		for _, e := range v.Array.Values {
			x, err := anyValue(e)
			if err != nil {
				return nil, err
			}
			values = append(values, x)
		}
		return values, nil
	}
	return nil, fmt.Errorf("a value of no type the tests know: %s", raw)
}

// OTLP enums as OTLP/JSON writes them: integers.
const (
	spanKindServer        = 2
	spanKindClient        = 3
	statusCodeError       = 2
	temporalityCumulative = 2
)

// otlpSpan is a span as the collector wrote it, with the resource of the
// batch it came in.
type otlpSpan struct {
	TraceID    string     `json:"traceId"` // hex
	SpanID     string     `json:"spanId"`
	ParentID   string     `json:"parentSpanId"`
	Name       string     `json:"name"`
	Kind       int        `json:"kind"`
	Start      int64      `json:"startTimeUnixNano,string"` // ns since the epoch
	End        int64      `json:"endTimeUnixNano,string"`
	Attributes attributes `json:"attributes"`
	Events     []struct {
		Name string `json:"name"`
		Time int64  `json:"timeUnixNano,string"`
	} `json:"events"`
	Status struct {
		Code int `json:"code"`
	} `json:"status"`
	Resource attributes `json:"-"`
}

// tag returns a span's attribute value, nil if it has none.
func (s otlpSpan) tag(key string) any { return s.Attributes[key] }

// event returns when the span's event name happened, in ns since the
// epoch, or 0.
func (s otlpSpan) event(name string) int64 {
	for _, e := range s.Events {
		if e.Name == name {
			return e.Time
		}
	}
	return 0
}

func (s otlpSpan) parent() string { return s.ParentID }

// spans reads every span the collector has written so far.
func (c *collector) spans(t *testing.T) []otlpSpan {
	t.Helper()
	var all []otlpSpan
	for _, line := range lines(t, c.traces) {
		var req struct {
			ResourceSpans []struct {
				Resource struct {
					Attributes attributes `json:"attributes"`
				} `json:"resource"`
				ScopeSpans []struct {
					Spans []otlpSpan `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			t.Fatalf("%s: %v", c.traces, err)
		}
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					s.Resource = rs.Resource.Attributes
					all = append(all, s)
				}
			}
		}
	}
	return all
}

// trace returns the spans of trace id the collector has written so far.
func (c *collector) trace(t *testing.T, id string) []otlpSpan {
	t.Helper()
	var tr []otlpSpan
	for _, s := range c.spans(t) {
		if s.TraceID == id {
			tr = append(tr, s)
		}
	}
	return tr
}

// await polls until found returns true or 20 s pass, and reports whether
// it did: export is asynchronous by design (a request never waits on it),
// and a file has no event to await.
func await(found func() bool) bool {
	deadline := time.Now().Add(20 * time.Second)
	for !found() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond) // polling a file or /metrics, which have no event to await
	}
	return true
}

// awaitTrace polls until trace id has at least n spans.
func (c *collector) awaitTrace(t *testing.T, id string, n int) []otlpSpan {
	t.Helper()
	var tr []otlpSpan
	if !await(func() bool { tr = c.trace(t, id); return len(tr) >= n }) {
		t.Fatalf("trace %s has %d spans in the collector after 20s, want %d", id, len(tr), n)
	}
	return tr
}

// awaitRequest polls until the collector has the SERVER span of the
// request with X-Request-Id id, sent by service, and returns its trace.
func (c *collector) awaitRequest(t *testing.T, service, id string) []otlpSpan {
	t.Helper()
	var traceID string
	found := await(func() bool {
		for _, s := range c.spans(t) {
			if s.Kind == spanKindServer && s.Resource["service.name"] == service && s.tag("gen_ai.request.id") == id {
				traceID = s.TraceID
				return true
			}
		}
		return false
	})
	if !found {
		t.Fatalf("no trace of request %s from %s in the collector after 20s", id, service)
	}
	return c.awaitTrace(t, traceID, 2)
}

// serverAndClient picks a trace's sidecar SERVER and CLIENT spans.
func serverAndClient(t *testing.T, tr []otlpSpan) (server, client otlpSpan) {
	t.Helper()
	for _, s := range tr {
		switch s.Kind {
		case spanKindServer:
			server = s
		case spanKindClient:
			client = s
		}
	}
	if server.SpanID == "" || client.SpanID == "" {
		t.Fatalf("no SERVER and CLIENT span pair among %d spans: %+v", len(tr), tr)
	}
	return server, client
}

// otlpLogRecord is a log record as the collector wrote it, with the
// resource of the batch it came in.
type otlpLogRecord struct {
	Time       int64      `json:"timeUnixNano,string"` // ns since the epoch; 0 when unset
	EventName  string     `json:"eventName"`
	Severity   int        `json:"severityNumber"`
	Attributes attributes `json:"attributes"`
	Resource   attributes `json:"-"`
}

// logRecords reads every log record the collector has written so far;
// none while it has written no file.
func (c *collector) logRecords(t *testing.T) []otlpLogRecord {
	t.Helper()
	if _, err := os.Stat(c.logs); os.IsNotExist(err) {
		return nil
	}
	var all []otlpLogRecord
	for _, line := range lines(t, c.logs) {
		var req struct {
			ResourceLogs []struct {
				Resource struct {
					Attributes attributes `json:"attributes"`
				} `json:"resource"`
				ScopeLogs []struct {
					LogRecords []otlpLogRecord `json:"logRecords"`
				} `json:"scopeLogs"`
			} `json:"resourceLogs"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			t.Fatalf("%s: %v", c.logs, err)
		}
		for _, rl := range req.ResourceLogs {
			for _, sl := range rl.ScopeLogs {
				for _, r := range sl.LogRecords {
					r.Resource = rl.Resource.Attributes
					all = append(all, r)
				}
			}
		}
	}
	return all
}

// histogramSeries is the newest data point of one histogram series: the
// sidecar's temporality is cumulative, so it holds the series' totals.
type histogramSeries struct {
	name        string
	resource    attributes
	unit        string
	temporality int
	point       histogramPoint
}

type histogramPoint struct {
	Attributes attributes `json:"attributes"`
	Time       int64      `json:"timeUnixNano,string"`
	Count      uint64     `json:"count,string"`
	Sum        float64    `json:"sum"`
	Bounds     []float64  `json:"explicitBounds"`
}

// histograms reads the metrics file: every histogram series' newest data
// point, by metric name.
func (c *collector) histograms(t *testing.T) map[string][]histogramSeries {
	t.Helper()
	newest := map[string]histogramSeries{}
	for _, line := range lines(t, c.metrics) {
		var req struct {
			ResourceMetrics []struct {
				Resource struct {
					Attributes attributes `json:"attributes"`
				} `json:"resource"`
				ScopeMetrics []struct {
					Metrics []struct {
						Name      string `json:"name"`
						Unit      string `json:"unit"`
						Histogram *struct {
							Temporality int              `json:"aggregationTemporality"`
							Points      []histogramPoint `json:"dataPoints"`
						} `json:"histogram"`
					} `json:"metrics"`
				} `json:"scopeMetrics"`
			} `json:"resourceMetrics"`
		}
		if err := json.Unmarshal(line, &req); err != nil {
			t.Fatalf("%s: %v", c.metrics, err)
		}
		for _, rm := range req.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if m.Histogram == nil {
						continue
					}
					for _, p := range m.Histogram.Points {
						// fmt prints maps sorted by key.
						key := fmt.Sprint(m.Name, rm.Resource.Attributes, p.Attributes)
						if old, ok := newest[key]; !ok || p.Time >= old.point.Time {
							newest[key] = histogramSeries{name: m.Name, resource: rm.Resource.Attributes, unit: m.Unit, temporality: m.Histogram.Temporality, point: p}
						}
					}
				}
			}
		}
	}
	byName := map[string][]histogramSeries{}
	for _, s := range newest {
		byName[s.name] = append(byName[s.name], s)
	}
	return byName
}

// histogramTotal sums the counts and sums of the series keep accepts.
func histogramTotal(series []histogramSeries, keep func(histogramSeries) bool) (uint64, float64) {
	var count uint64
	var sum float64
	for _, s := range series {
		if keep(s) {
			count += s.point.Count
			sum += s.point.Sum
		}
	}
	return count, sum
}

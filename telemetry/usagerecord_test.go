package telemetry

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// usageCapture keeps the records a Recorder gives it.
type usageCapture struct {
	mu           sync.Mutex
	starts, ends map[string]string
}

func (u *usageCapture) Start(id string, b []byte) {
	u.mu.Lock()
	u.starts[id] = string(b)
	u.mu.Unlock()
}
func (u *usageCapture) End(id string, b []byte) { u.mu.Lock(); u.ends[id] = string(b); u.mu.Unlock() }

type usageEvent struct {
	SpecVersion, ID, Source, Type, Subject, Time, DataContentType string
	Data                                                          map[string]any
}

func decodeUsage(t *testing.T, s string) usageEvent {
	t.Helper()
	var e usageEvent
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	if err := d.Decode(&e); err != nil {
		t.Fatalf("record is not JSON: %v\n%s", err, s)
	}
	return e
}

// TestUsageRecord: a request's start spools the record it gets if the
// process dies, its end the record of how it ended; both are valid
// CloudEvents whatever the client's strings, with one id.
func TestUsageRecord(t *testing.T) {
	capture := &usageCapture{starts: map[string]string{}, ends: map[string]string{}}
	r := NewRecorder(prometheus.NewRegistry(), Options{MaxModels: 4, Usage: capture,
		UsageEnvelope: UsageEnvelope{Type: "usage.v1", Source: "timing-sidecar/pod-1"}})
	hostile := "q\"b\\s\n\r\t\x00\x1f<>&\u2028\u2029é\xff€😀"
	arrival := time.Date(2026, 12, 5, 1, 2, 3, 456789000, time.UTC)
	for _, tc := range []struct {
		name string
		req  Record
		end  string
		want map[string]any
	}{
		{"completed stream", Record{ID: "r1", Endpoint: EndpointChat, Model: "llama", Tenant: "acme", Variant: "canary", Stream: true, Status: 200, Measured: true,
			Elapsed: 1500 * time.Millisecond, Metrics: timing.Metrics{PromptTokens: cnt(7), CachedTokens: cnt(0), Cache: timing.CacheNone,
				Sent: cnt(12), SentFrom: timing.CountUsage, ReasoningTokens: cnt(5), FirstTokenAfterArrival: num(80.5), MeanITL: num(7.25)}},
			EndCompleted, map[string]any{"prompt_tokens": "7", "prompt_tokens_from": "usage", "cached_tokens": "0", "completion_tokens": "12",
				"completion_tokens_from": "usage", "reasoning_tokens": "5", "cache_write_tokens": nil, "cache_write_tokens_from": "unknown",
				"time_to_first_token_ms": "80.5", "mean_itl_ms": "7.25", "duration_ms": "1500", "status": "200", "tenant": "acme", "variant": "canary"}},
		{"cut by its client", Record{ID: "r2", Endpoint: EndpointChat, Model: "llama", Stream: true, Status: 200, ClientGone: true, Measured: true,
			Elapsed: time.Second, Metrics: timing.Metrics{Sent: cnt(3), SentFrom: timing.CountCounted}},
			EndClientGone, map[string]any{"completion_tokens": "3", "completion_tokens_from": "counted", "prompt_tokens": nil,
				"prompt_tokens_from": "unknown", "cached_tokens_from": "unknown", "tenant": nil, "variant": nil}},
		{"cut at shutdown", Record{ID: "r3", Endpoint: EndpointCompletions, Stream: true, Status: 200, CutAtShutdown: true, ClientGone: true, Measured: true},
			EndShutdown, map[string]any{"model": nil, "duration_ms": nil}},
		{"engine failed", Record{ID: "r4", Endpoint: EndpointChat, Status: 502, UpstreamError: ErrorConnect, Elapsed: time.Millisecond},
			EndEngineError, map[string]any{"upstream_error": "connect", "status": "502", "completion_tokens": nil, "completion_tokens_from": "unknown"}},
		{"hostile strings", Record{ID: hostile, Endpoint: EndpointChat, Model: hostile, Tenant: hostile, Variant: hostile, Status: 200},
			EndCompleted, map[string]any{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			r.Begin()
			r.StartUsage(&req, arrival)
			if req.UsageID == "" || capture.starts[req.UsageID] == "" {
				t.Fatal("no start spooled")
			}
			lost := decodeUsage(t, capture.starts[req.UsageID])
			r.Finish(&req)
			e := decodeUsage(t, capture.ends[req.UsageID])
			for _, ev := range []usageEvent{lost, e} {
				if ev.SpecVersion != "1.0" || ev.ID != req.UsageID || ev.Source != "timing-sidecar/pod-1" || ev.Type != "usage.v1" ||
					ev.Time != "2026-12-05T01:02:03.456789Z" || ev.DataContentType != "application/json" || ev.Subject == "" {
					t.Errorf("envelope %+v", ev)
				}
				if ev.Data["request_id"] != req.ID || ev.Data["schema_version"] != json.Number("1") || ev.Data["endpoint"] != req.Endpoint {
					t.Errorf("data %v", ev.Data)
				}
			}
			if lost.Data["end"] != EndLost || lost.Data["status"] != nil || lost.Data["completion_tokens_from"] != "unknown" || lost.Data["end_time"] != nil {
				t.Errorf("a lost request's record: %v", lost.Data)
			}
			if e.Data["end"] != tc.end || e.Data["end_time"] == nil {
				t.Errorf("end %v, want %s", e.Data["end"], tc.end)
			}
			for k, want := range tc.want {
				got := e.Data[k]
				if n, ok := got.(json.Number); ok {
					got = string(n)
				}
				if got != want {
					t.Errorf("%s = %v, want %v", k, got, want)
				}
			}
			if subject := e.Subject; (req.Tenant == "") != (subject == UsageSubjectNone) {
				t.Errorf("subject %q for tenant %q", subject, req.Tenant)
			}
		})
	}
}

// TestReadmeDocumentsTheUsageRecord keeps the README's record table in step
// with the record: every data member is in it, and nothing else.
func TestReadmeDocumentsTheUsageRecord(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "<!-- usage record -->")
	table, _, _ = strings.Cut(table, "\n\n")
	if !ok {
		t.Fatal("no usage record table in README.md")
	}
	var documented []string
	for _, row := range strings.Split(table, "\n")[3:] {
		cells := strings.Split(row, "|")
		if len(cells) < 3 {
			continue
		}
		for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(cells[1], -1) {
			documented = append(documented, m[1])
		}
	}
	req := Record{Endpoint: EndpointChat, Status: 200, Measured: true}
	b := appendUsageRecord(nil, &UsageEnvelope{}, &req, EndCompleted, time.Now())
	e := decodeUsage(t, string(b))
	var members []string
	for k := range e.Data {
		members = append(members, k)
	}
	// Each count's source is documented with its count.
	members = slices.DeleteFunc(members, func(k string) bool { return strings.HasSuffix(k, "_from") })
	slices.Sort(members)
	slices.Sort(documented)
	if !slices.Equal(members, documented) {
		t.Errorf("the record's data members\n%v\nthe README's table\n%v", members, documented)
	}
}

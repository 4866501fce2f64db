package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/timing-sidecar/timing-sidecar/timing"
)

// finish runs Begin and Finish, turning a panic into a test failure.
func finish(t *testing.T, r *Recorder, req *Record) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Finish panicked: %v", p)
		}
	}()
	r.Begin()
	r.Finish(req)
}

// labelValues gathers reg and returns every label value of every series.
func labelValues(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var values []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				values = append(values, lp.GetValue())
			}
		}
	}
	return values
}

func TestInvalidUTF8LabelsAreReplaced(t *testing.T) {
	var buf lockedBuffer
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg, Options{MaxModels: 8, TenantLabel: true, MaxTenants: 8, AccessLog: &buf})
	req := requests[0]
	req.ID, req.Model, req.Tenant = "id\xfd", "m\xff", "t\xfe"
	finish(t, r, &req)
	for _, v := range labelValues(t, reg) {
		if !utf8.ValidString(v) {
			t.Errorf("label value %q is not valid UTF-8", v)
		}
	}
	want := `
# HELP timing_sidecar_requests_total Requests handled, by endpoint, streaming, status (499: the client left first) and model.
# TYPE timing_sidecar_requests_total counter
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="m` + "\uFFFD" + `",status="200",stream="true",tenant="t` + "\uFFFD" + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "timing_sidecar_requests_total"); err != nil {
		t.Error(err)
	}
	r.Close(context.Background())
	if !json.Valid([]byte(buf.String())) {
		t.Fatalf("access log line is not valid JSON: %q", buf.String())
	}
	var line map[string]any
	json.Unmarshal([]byte(buf.String()), &line)
	for k, v := range map[string]string{"request_id": "id\uFFFD", "model": "m\uFFFD", "tenant": "t\uFFFD"} {
		if line[k] != v {
			t.Errorf("access log %s = %q, want %q", k, line[k], v)
		}
	}
}

func TestLongModelNameIsCut(t *testing.T) {
	var buf lockedBuffer
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg, Options{MaxModels: 32, MaxTenants: 8, AccessLog: &buf})
	// A 3-byte rune, so 256 bytes falls inside one: the cut must not split it.
	long := strings.Repeat("€", 1<<20/3+1)
	req := requests[0]
	req.Model = long
	finish(t, r, &req)
	var model string
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "model" {
					model = lp.GetValue()
				}
			}
		}
	}
	if len(model) > maxLabelBytes || !utf8.ValidString(model) || !strings.HasPrefix(long, model) || len(model) < maxLabelBytes-3 {
		t.Errorf("model label is %d bytes (valid %v), want the longest whole-rune prefix of at most %d",
			len(model), utf8.ValidString(model), maxLabelBytes)
	}
	var text bytes.Buffer
	for _, mf := range mfs {
		writeText(&text, mf)
	}
	// Nine series carry the model, six histograms of 25 lines each and
	// three counters: about 65 KB with a 256-byte label, over 150 MB with
	// the whole name.
	if text.Len() > 80<<10 {
		t.Errorf("exposition of one request is %d bytes", text.Len())
	}
	r.Close(context.Background())
	if n := len(buf.String()); n > 2<<10 {
		t.Errorf("access log line is %d bytes", n)
	}
}

func TestJunkModelsDoNotTakeSlots(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg, Options{MaxModels: 32, MaxTenants: 8})
	for i := range 40 {
		finish(t, r, &Record{Endpoint: EndpointChat, Model: fmt.Sprintf("junk-%d", i), Status: 404})
	}
	finish(t, r, &Record{Endpoint: EndpointChat, Model: "llama", Status: 200})
	finish(t, r, &Record{Endpoint: EndpointChat, Model: "llama", Status: 400})
	want := `
# HELP timing_sidecar_requests_total Requests handled, by endpoint, streaming, status (499: the client left first) and model.
# TYPE timing_sidecar_requests_total counter
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="llama",status="200",stream="false"} 1
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="llama",status="400",stream="false"} 1
timing_sidecar_requests_total{endpoint="chat_completions",leg="whole",model="other",status="404",stream="false"} 40
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "timing_sidecar_requests_total"); err != nil {
		t.Fatal(err)
	}
}

// TestAdmission: a value takes a slot only with a served (2xx) request,
// and once admitted it keeps its label whatever the status.
func TestAdmission(t *testing.T) {
	type step struct {
		value  string
		served bool
		want   string
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"served value is admitted", []step{{"a", true, "a"}, {"a", false, "a"}}},
		{"failed value is other and takes no slot", []step{{"x", false, otherLabel}, {"a", true, "a"}, {"x", false, otherLabel}}},
		{"failed value is admitted once served", []step{{"a", false, otherLabel}, {"a", true, "a"}, {"a", false, "a"}}},
		{"empty stays empty", []step{{"", false, ""}, {"", true, ""}}},
		{"full is other even when served", []step{{"a", true, "a"}, {"b", true, "b"}, {"c", true, otherLabel}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newBoundedLabel(2)
			for i, s := range tc.steps {
				if got := b.value(s.value, s.served); got != s.want {
					t.Errorf("step %d: value(%q, served %v) = %q, want %q", i, s.value, s.served, got, s.want)
				}
			}
		})
	}
}

func TestClean(t *testing.T) {
	long := strings.Repeat("a", maxLabelBytes)
	for _, tc := range []struct {
		name, in, want string
	}{
		{"clean is kept", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B"},
		{"empty is kept", "", ""},
		{"invalid byte is replaced", "m\xff", "m\uFFFD"},
		{"invalid run is one replacement", "a\xff\xfe\xfdb", "a\uFFFDb"},
		{"exactly the bound is kept", long, long},
		{"past the bound is cut", long + "b", long},
		{"cut does not split a rune", long[:maxLabelBytes-1] + "€", long[:maxLabelBytes-1]},
		{"invalid and long", "\xff" + long, "\uFFFD" + long[:maxLabelBytes-3]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := clean(tc.in); got != tc.want {
				t.Errorf("clean(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestCleanKeepsNoLargeString(t *testing.T) {
	// A label kept by a cut must not pin the client's 1 MB body string.
	long := strings.Repeat("a", 1<<20)
	if got := clean(long); unsafe.StringData(got) == unsafe.StringData(long) {
		t.Error("clean returned a slice of its input")
	}
}

func TestCleanDoesNotAllocateWhenClean(t *testing.T) {
	s := strings.Repeat("a", maxLabelBytes)
	if n := testing.AllocsPerRun(100, func() { _ = clean(s) }); n != 0 {
		t.Errorf("clean of a clean value allocates %v times", n)
	}
}

func FuzzClean(f *testing.F) {
	for _, s := range []string{"", "llama", "m\xff", "t\xfe\xfd", strings.Repeat("€", 100), strings.Repeat("a", 255) + "\xff\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := clean(s)
		if !utf8.ValidString(got) || len(got) > maxLabelBytes {
			t.Fatalf("clean(%q) = %q: %d bytes, valid %v", s, got, len(got), utf8.ValidString(got))
		}
		if utf8.ValidString(s) && !strings.HasPrefix(s, got) {
			t.Fatalf("clean(%q) = %q is not a prefix of a valid input", s, got)
		}
		if utf8.ValidString(s) && len(s) <= maxLabelBytes && got != s {
			t.Fatalf("clean(%q) = %q changed a clean value", s, got)
		}
		if clean(got) != got {
			t.Fatalf("clean is not idempotent on %q", s)
		}
	})
}

// variantFamilies are the series that carry the "variant" label when
// variants are configured: every latency histogram (but the relay delay),
// and the request, token and goodput counters.
var variantFamilies = []string{
	"timing_sidecar_queue_time_seconds", "timing_sidecar_time_to_first_token_seconds",
	"timing_sidecar_time_to_first_content_token_seconds", "timing_sidecar_inter_token_latency_seconds",
	"timing_sidecar_max_inter_token_latency_seconds", "timing_sidecar_e2e_request_latency_seconds",
	"timing_sidecar_prefill_tokens_per_second", "timing_sidecar_tokens_per_event",
	"timing_sidecar_requests_total", "timing_sidecar_prompt_tokens_total", "timing_sidecar_generation_tokens_total",
	"timing_sidecar_cached_prompt_tokens_total", "timing_sidecar_cache_write_prompt_tokens_total",
	"timing_sidecar_slo_requests_total",
}

// variantRecord is a measured stream with every figure a series observes.
var variantRecord = Record{Endpoint: EndpointChat, Model: "m", Tenant: "acme", Stream: true, Status: 200, Measured: true,
	Metrics: timing.Metrics{QueueTime: num(5), FirstTokenAfterArrival: num(90), FirstContentAfterArrival: num(95), MeanITL: num(12),
		MaxITL: num(30), E2ELatency: num(400), PrefillTokensPerSecond: num(3000), TokensPerEvent: num(1), PromptTokens: cnt(900),
		CompletionTokens: cnt(20), CachedTokens: cnt(0), Cache: timing.CacheNone, CacheWriteTokens: cnt(900)}}

// TestVariantLabel: with variants configured, each series a request
// reaches carries its arm ("" for none); without, no series has the label,
// whatever the record says.
func TestVariantLabel(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    Options
		variant string
		label   bool   // the families carry the label
		want    string // its value
	}{
		{"off", Options{}, "canary", false, ""},
		{"the request's arm", Options{VariantLabel: true, MaxVariants: 8, Variant: "stable"}, "canary", true, "canary"},
		{"the deployment's arm", Options{VariantLabel: true, MaxVariants: 8, Variant: "stable"}, "stable", true, "stable"},
		{"no arm", Options{VariantLabel: true, MaxVariants: 8}, "", true, ""},
		{"beside the tenant", Options{VariantLabel: true, MaxVariants: 8, TenantLabel: true}, "canary", true, "canary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			opts := tc.opts
			opts.MaxModels, opts.MaxTenants, opts.Objectives = 8, 8, Objectives{E2E: time.Second}
			r := NewRecorder(reg, opts)
			req := variantRecord
			req.Variant = tc.variant
			finish(t, r, &req)
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for _, mf := range mfs {
				labelled := tc.label && slices.Contains(variantFamilies, mf.GetName())
				seen[mf.GetName()] = true
				for _, m := range mf.GetMetric() {
					switch v, has := labelValue(m, "variant"); {
					case has != labelled:
						t.Errorf("%s: variant label present %v, want %v", mf.GetName(), has, labelled)
					case has && v != tc.want:
						t.Errorf("%s: variant %q, want %q", mf.GetName(), v, tc.want)
					}
				}
			}
			for _, name := range variantFamilies {
				if !seen[name] {
					t.Errorf("no %s series", name)
				}
			}
		})
	}
}

// labelValue is the value of m's label name, and whether m has it.
func labelValue(m *dto.Metric, name string) (string, bool) {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue(), true
		}
	}
	return "", false
}

// TestVariantAdmission: the deployment's arm (--variant) is admitted from
// the start; a request's own arm takes a slot as a tenant does, only with
// a 2xx answer, and past --max-variant-labels counts as "other".
func TestVariantAdmission(t *testing.T) {
	type step struct {
		variant string
		status  int
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  map[string]float64 // requests by "variant status"
	}{
		{"the deployment's arm, served or not", []step{{"stable", 503}, {"stable", 200}},
			map[string]float64{"stable 503": 1, "stable 200": 1}},
		{"a 4xx arm takes no slot", []step{{"x", 404}, {"canary", 200}, {"x", 404}},
			map[string]float64{"other 404": 2, "canary 200": 1}},
		{"past the bound, other", []step{{"canary", 200}, {"b", 200}, {"canary", 503}},
			map[string]float64{"canary 200": 1, "other 200": 1, "canary 503": 1}},
		{"no arm is empty", []step{{"", 200}}, map[string]float64{" 200": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			// Two slots: the deployment's arm and one more.
			r := NewRecorder(reg, Options{MaxModels: 8, VariantLabel: true, MaxVariants: 2, Variant: "stable"})
			for _, s := range tc.steps {
				finish(t, r, &Record{Endpoint: EndpointChat, Variant: s.variant, Status: s.status})
			}
			got := map[string]float64{}
			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			for _, mf := range mfs {
				if mf.GetName() != "timing_sidecar_requests_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					v, _ := labelValue(m, "variant")
					status, _ := labelValue(m, "status")
					got[v+" "+status] += m.GetCounter().GetValue()
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("requests by variant and status %v, want %v", got, tc.want)
			}
		})
	}
}

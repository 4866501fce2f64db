package telemetry

import (
	"context"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
	"github.com/timing-sidecar/timing-sidecar/telemetry/usage"
)

// TestReadmeListsEverySeries keeps the README's Prometheus series table in
// step with what the recorder registers: every series named there exists,
// with that type, and every series registered is named there.
func TestReadmeListsEverySeries(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\| `(timing_sidecar_[a-z0-9_]+)` \\| (histogram|counter|gauge) \\|")
	documented := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(readme), -1) {
		documented[m[1]] = m[2]
	}
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg, Options{MaxModels: 4, MaxTenants: 4, Objectives: Objectives{E2E: time.Second}, AccessLog: io.Discard})
	defer r.Close(context.Background())
	// One request of each kind, so that every vector has a series.
	for _, req := range requests {
		r.Begin()
		r.Finish(&req)
	}
	r.Panic()
	// The tracer's series exist when tracing is on.
	tracer, err := NewTracer(OTLP{Traces: Signal{On: true}, SpanExporter: tracetest.NewNoopExporter()}, reg, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer tracer.Shutdown(t.Context()) //nolint:errcheck
	// And the GenAI metrics' when they are exported.
	genai, err := NewGenAIMetrics(OTLP{Metrics: Signal{On: true}, MetricExporter: nopExporter{}}, reg, quiet, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer genai.Shutdown(t.Context()) //nolint:errcheck
	// And the usage records' when a sink is set.
	records, err := usage.Open(usage.Options{Spool: spool.Options{Dir: t.TempDir(), MaxSize: 1 << 20}, Sinks: []usage.Sink{discardSink{}}, Log: quiet}, reg)
	if err != nil {
		t.Fatal(err)
	}
	defer records.Close(t.Context())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var registered []string
	for _, mf := range families {
		name, typ := mf.GetName(), strings.ToLower(mf.GetType().String())
		registered = append(registered, name)
		switch want, ok := documented[name]; {
		case !ok:
			t.Errorf("%s (%s) is registered but not in telemetry/README.md", name, typ)
		case want != typ:
			t.Errorf("%s is a %s, the README says %s", name, typ, want)
		}
	}
	for name := range documented {
		if !slices.Contains(registered, name) {
			t.Errorf("the README lists %s, which is not registered", name)
		}
	}
}

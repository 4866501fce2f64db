package telemetry

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/timing-sidecar/timing-sidecar/telemetry/spool"
	"github.com/timing-sidecar/timing-sidecar/telemetry/usage"
)

// discardSink acknowledges every batch at once.
type discardSink struct{}

func (discardSink) Name() string                               { return usage.SinkCloudEvents }
func (discardSink) Send(context.Context, []spool.Record) error { return nil }
func (discardSink) Close(context.Context) error                { return nil }

// BenchmarkFinish records a measured streamed request of an admitted model
// with the tenant label on: the cost every request pays once, without and
// with the access log, with the OpenTelemetry GenAI metrics beside the
// Prometheus series, and with the variant label on too.
func BenchmarkFinish(b *testing.B) {
	for _, bc := range []struct {
		name    string
		log     io.Writer
		genai   bool
		usage   bool
		variant bool
	}{
		{"metrics", nil, false, false, false},
		{"access_log", io.Discard, false, false, false},
		{"metrics+genai", nil, true, false, false},
		{"access_log+genai", io.Discard, true, false, false},
		{"access_log+usage", io.Discard, false, true, false},
		{"metrics+variant", nil, false, false, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			opts := Options{MaxModels: 8, TenantLabel: true, MaxTenants: 8, AccessLog: bc.log,
				VariantLabel: bc.variant, MaxVariants: 8, Variant: "stable"}
			if bc.genai {
				g, err := NewGenAIMetrics(OTLP{Metrics: Signal{On: true}, MetricReader: sdkmetric.NewManualReader()}, reg, quiet, "10.0.0.5", 8000)
				if err != nil {
					b.Fatal(err)
				}
				defer g.Shutdown(context.Background()) //nolint:errcheck
				opts.GenAI = g
			}
			if bc.usage {
				// A record's start and end into a spool on disk, read
				// back by a sink that acknowledges at once.
				u, err := usage.Open(usage.Options{Spool: spool.Options{Dir: b.TempDir(), MaxSize: 1 << 30},
					Sinks: []usage.Sink{discardSink{}}, Log: quiet}, reg)
				if err != nil {
					b.Fatal(err)
				}
				defer u.Close(context.Background())
				opts.Usage, opts.UsageEnvelope = u, UsageEnvelope{Type: "timing-sidecar.usage.v1", Source: "timing-sidecar/pod-1"}
			}
			r := NewRecorder(reg, opts)
			req := requests[0]
			req.Method, req.Path, req.Tenant, req.ResponseModel = "POST", "/v1/chat/completions", "acme", req.Model
			if bc.variant {
				req.Variant = "canary"
			}
			b.ReportAllocs()
			for b.Loop() {
				r.Begin()
				if bc.usage {
					req.UsageID = ""
					r.StartUsage(&req, time.Now())
				}
				r.Finish(&req)
			}
		})
	}
}

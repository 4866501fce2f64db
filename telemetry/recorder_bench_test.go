package telemetry

import (
	"context"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// BenchmarkFinish records a measured streamed request of an admitted model
// with the tenant label on: the cost every request pays once, without and
// with the access log, and with the OpenTelemetry GenAI metrics beside
// the Prometheus series.
func BenchmarkFinish(b *testing.B) {
	for _, bc := range []struct {
		name  string
		log   io.Writer
		genai bool
	}{
		{"metrics", nil, false},
		{"access_log", io.Discard, false},
		{"metrics+genai", nil, true},
		{"access_log+genai", io.Discard, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			opts := Options{MaxModels: 8, TenantLabel: true, MaxTenants: 8, AccessLog: bc.log}
			if bc.genai {
				g, err := NewGenAIMetrics(OTLP{Metrics: Signal{On: true}, MetricReader: sdkmetric.NewManualReader()}, reg, quiet, "10.0.0.5", 8000)
				if err != nil {
					b.Fatal(err)
				}
				defer g.Shutdown(context.Background()) //nolint:errcheck
				opts.GenAI = g
			}
			r := NewRecorder(reg, opts)
			req := requests[0]
			req.Method, req.Path, req.Tenant, req.ResponseModel = "POST", "/v1/chat/completions", "acme", req.Model
			b.ReportAllocs()
			for b.Loop() {
				r.Begin()
				r.Finish(&req)
			}
		})
	}
}

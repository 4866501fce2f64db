package telemetry

import (
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkFinish records a measured streamed request of an admitted model
// with the tenant label on: the cost every request pays once, without and
// with the access log.
func BenchmarkFinish(b *testing.B) {
	for _, bc := range []struct {
		name string
		log  io.Writer
	}{
		{"metrics", nil},
		{"access_log", io.Discard},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := NewRecorder(prometheus.NewRegistry(), Options{MaxModels: 8, TenantLabel: true, MaxTenants: 8, AccessLog: bc.log})
			req := requests[0]
			req.Method, req.Path, req.Tenant = "POST", "/v1/chat/completions", "acme"
			b.ReportAllocs()
			for b.Loop() {
				r.Begin()
				r.Finish(&req)
			}
		})
	}
}

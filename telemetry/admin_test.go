package telemetry

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestAdminHandler(t *testing.T) {
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "timing_sidecar_test_total", Help: "A test counter."})
	reg.MustRegister(c)
	c.Inc()
	ready, reason := false, "engine not ready: GET /health answered 503"
	h := func(pprofOn bool) http.Handler {
		return AdminHandler(reg, func() (bool, string) { return ready, reason }, pprofOn)
	}
	get := func(h http.Handler, path, accept string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", path, nil)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, tt := range []struct {
		name, path, accept string
		pprof              bool
		status             int
		body               string
	}{
		{"metrics: the registry's series", "/metrics", "", false, 200, "timing_sidecar_test_total 1"},
		{"metrics: the runtime beside them", "/metrics", "", false, 200, "go_goroutines"},
		{"metrics: OpenMetrics when asked", "/metrics", "application/openmetrics-text; version=1.0.0", false, 200, "# EOF"},
		{"healthz: the process is up", "/healthz", "", false, 200, "ok"},
		{"readyz: not ready, with the reason", "/readyz", "", false, 503, reason},
		{"pprof off by default", "/debug/pprof/", "", false, 404, ""},
		{"pprof when asked", "/debug/pprof/", "", true, 200, "goroutine"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rec := get(h(tt.pprof), tt.path, tt.accept)
			if rec.Code != tt.status || !strings.Contains(rec.Body.String(), tt.body) {
				t.Errorf("%s: %d %q, want %d with %q", tt.path, rec.Code, rec.Body.String(), tt.status, tt.body)
			}
		})
	}
	ready = true
	if rec := get(h(false), "/readyz", ""); rec.Code != 200 {
		t.Errorf("ready: %d %q", rec.Code, rec.Body.String())
	}
}

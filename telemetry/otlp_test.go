package telemetry

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdklog "go.opentelemetry.io/otel/sdk/log"
)

// otlpVariables are every variable Resolve reads, cleared by each case.
var otlpVariables = []string{"OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL",
	"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT",
	"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL",
	"OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER", "OTEL_TRACES_SAMPLER"}

// TestOTLPSignals: each signal is on, and speaks, as its flag and the
// variables say, the three read the same way in one place.
func TestOTLPSignals(t *testing.T) {
	type want struct {
		on, own  bool
		protocol string
	}
	off := want{}
	grpc := want{on: true, protocol: ProtocolGRPC}
	for _, tc := range []struct {
		name                  string
		cfg                   OTLPConfig
		env                   map[string]string
		traces, metrics, logs want
		bad                   string
	}{
		{name: "nothing set", traces: off, metrics: off, logs: off},
		{name: "a flag turns its signal on", cfg: OTLPConfig{Traces: SignalConfig{Endpoint: "http://c:4317"}},
			traces: want{true, true, ProtocolGRPC}},
		{name: "a signal's variable", env: map[string]string{"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://c:4317"},
			logs: want{true, true, ProtocolGRPC}},
		{name: "the shared variable turns all on, none its own", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"},
			traces: grpc, metrics: grpc, logs: grpc},
		{name: "exporter none", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"},
			traces: grpc},
		{name: "a flag beats exporter none", cfg: OTLPConfig{Metrics: SignalConfig{Endpoint: "http://c:4317"}}, env: map[string]string{"OTEL_METRICS_EXPORTER": "none"},
			metrics: want{true, true, ProtocolGRPC}},
		{name: "sdk disabled beats the flag", cfg: OTLPConfig{Traces: SignalConfig{Endpoint: "http://c:4317"}}, env: map[string]string{"OTEL_SDK_DISABLED": "true"},
			traces: want{false, true, ""}},
		{name: "sampler alone", env: map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}},
		{name: "protocol: flag, then signal's variable, then shared", cfg: OTLPConfig{Traces: SignalConfig{Endpoint: "http://c", Protocol: ProtocolHTTP}},
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
				"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
			traces: want{true, true, ProtocolHTTP}, metrics: grpc, logs: want{true, false, ProtocolHTTP}},
		{name: "every bad protocol said at once", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, bad: "OTLP metrics protocol \"http/json\"", traces: grpc},
		{name: "an exporter in place of OTLP", cfg: OTLPConfig{LogExporter: &captureLogExporter{}}, logs: want{on: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range otlpVariables {
				t.Setenv(k, tc.env[k])
			}
			o, err := tc.cfg.Resolve(quiet)
			if tc.bad != "" {
				if err == nil || !strings.Contains(err.Error(), tc.bad) || !strings.Contains(err.Error(), "OTLP logs protocol") {
					t.Fatalf("err = %v, want %q and the logs' too", err, tc.bad)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			for _, s := range []struct {
				name string
				got  Signal
				want want
			}{{"traces", o.Traces, tc.traces}, {"metrics", o.Metrics, tc.metrics}, {"logs", o.Logs, tc.logs}} {
				if s.got.On != s.want.on || s.got.Own != s.want.own || s.got.Protocol != s.want.protocol {
					t.Errorf("%s: %+v, want %+v", s.name, s.got, s.want)
				}
			}
			if (o.Resource != nil) != (o.Traces.On || o.Metrics.On || o.Logs.On) {
				t.Errorf("resource %v with signals %+v", o.Resource, o)
			}
			if err != nil {
				return
			}
			// Each signal's constructor honours its part.
			tr, err := NewTracer(o, prometheus.NewRegistry(), quiet)
			if err != nil || (tr != nil) != o.Traces.On {
				t.Errorf("NewTracer: %v, %v; want on = %v", tr, err, o.Traces.On)
			}
			tr.Shutdown(context.Background()) //nolint:errcheck
			g, err := NewGenAIMetrics(o, prometheus.NewRegistry(), quiet, "", 0)
			if err != nil || (g != nil) != o.Metrics.On {
				t.Errorf("NewGenAIMetrics: %v, %v; want on = %v", g, err, o.Metrics.On)
			}
			// No collector there: the last export is given up at once.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			g.Shutdown(ctx) //nolint:errcheck
		})
	}
}

// captureLogExporter keeps what it is given.
type captureLogExporter struct{ records []sdklog.Record }

func (e *captureLogExporter) Export(_ context.Context, records []sdklog.Record) error {
	e.records = append(e.records, records...)
	return nil
}
func (e *captureLogExporter) Shutdown(context.Context) error   { return nil }
func (e *captureLogExporter) ForceFlush(context.Context) error { return nil }

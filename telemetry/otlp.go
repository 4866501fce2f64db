package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploggrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	sdklog "go.opentelemetry.io/otel/sdk/log"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
)

// What the three OTLP signals (traces, metrics, the usage records' logs)
// share: the flags and OTEL_* variables are read once, at start, into one
// OTLP value that each signal's exporter takes.

// OTLPConfig is what the flags say of OTLP.
type OTLPConfig struct {
	Traces, Metrics, Logs SignalConfig
	// Identity names the sidecar in every signal's resource.
	Identity
	// SpanExporter, MetricReader, MetricExporter and LogExporter, when
	// set, take a signal instead of an OTLP exporter (tests, and programs
	// that embed the proxy); such a signal is on without an endpoint.
	SpanExporter   sdktrace.SpanExporter
	MetricReader   sdkmetric.Reader
	MetricExporter sdkmetric.Exporter
	LogExporter    sdklog.Exporter
}

// SignalConfig is one signal's flags.
type SignalConfig struct {
	// Endpoint is the signal's OTLP URL (--otlp-<signal>-endpoint), with
	// the meaning of OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT. Empty leaves the
	// endpoint to the OTEL_EXPORTER_OTLP_* variables.
	Endpoint string
	// Protocol is ProtocolGRPC or ProtocolHTTP; empty reads
	// OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL, then OTEL_EXPORTER_OTLP_PROTOCOL,
	// then takes DefaultProtocol.
	Protocol string
}

// OTLP is the OTLP settings, resolved once.
type OTLP struct {
	Traces, Metrics, Logs Signal
	// Resource is every signal's resource.
	Resource *resource.Resource
	// The replacements for OTLP exporters, as OTLPConfig has them.
	SpanExporter   sdktrace.SpanExporter
	MetricReader   sdkmetric.Reader
	MetricExporter sdkmetric.Exporter
	LogExporter    sdklog.Exporter
}

// Signal is one signal's resolved settings.
type Signal struct {
	// On: an endpoint is set, by flag or by variable, or a replacement
	// exporter; OTEL_SDK_DISABLED=true, or OTEL_<SIGNAL>_EXPORTER=none
	// without a flag, turn it off. Unlike an SDK, the sidecar does not
	// send to localhost when nothing is set: every signal is opt-in.
	On bool
	// Own: the signal's own endpoint is set (its flag, or
	// OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT), not only the shared
	// OTEL_EXPORTER_OTLP_ENDPOINT.
	Own bool
	// Endpoint is the flag's URL; empty leaves the endpoint to the
	// exporter, which reads the variables.
	Endpoint string
	Protocol string
}

// Resolve reads c with the OTEL_* variables into the settings every
// signal takes. Every problem is returned at once.
func (c OTLPConfig) Resolve(log *slog.Logger) (OTLP, error) {
	o := OTLP{SpanExporter: c.SpanExporter, MetricReader: c.MetricReader, MetricExporter: c.MetricExporter, LogExporter: c.LogExporter}
	var errs []error
	for _, s := range []struct {
		out      *Signal
		flags    SignalConfig
		name     string
		replaced bool
	}{
		{&o.Traces, c.Traces, "TRACES", c.SpanExporter != nil},
		{&o.Metrics, c.Metrics, "METRICS", c.MetricReader != nil || c.MetricExporter != nil},
		{&o.Logs, c.Logs, "LOGS", c.LogExporter != nil},
	} {
		sig, err := resolveSignal(s.flags, s.name, s.replaced)
		*s.out = sig
		errs = append(errs, err)
	}
	if o.Traces.On || o.Metrics.On || o.Logs.On {
		o.Resource = newResource(c.Identity, log)
	}
	return o, errors.Join(errs...)
}

// resolveSignal resolves one signal (TRACES, METRICS, LOGS).
func resolveSignal(flags SignalConfig, signal string, replaced bool) (Signal, error) {
	s := Signal{Endpoint: flags.Endpoint}
	s.Own = flags.Endpoint != "" || os.Getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != ""
	switch {
	case strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true"):
	case replaced || flags.Endpoint != "":
		s.On = true
	case strings.EqualFold(os.Getenv("OTEL_"+signal+"_EXPORTER"), "none"):
	default:
		s.On = s.Own || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
	}
	if !s.On || replaced {
		return s, nil
	}
	s.Protocol = flags.Protocol
	for _, name := range []string{"OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if s.Protocol == "" {
			s.Protocol = os.Getenv(name)
		}
	}
	switch s.Protocol {
	case "":
		s.Protocol = DefaultProtocol
	case ProtocolGRPC, ProtocolHTTP:
	default:
		err := fmt.Errorf("OTLP %s protocol %q: want %q or %q (the Go exporters have no http/json)",
			strings.ToLower(signal), s.Protocol, ProtocolGRPC, ProtocolHTTP)
		return Signal{}, err
	}
	return s, nil
}

// processInstanceID is this process's service.instance.id when none is
// configured: a random UUID, as the conventions recommend, the same for
// every signal.
var processInstanceID = sync.OnceValue(uuid.NewString)

// Identity is what names this sidecar to a telemetry backend.
type Identity struct {
	// ServiceVersion is service.version.
	ServiceVersion string
	// InstanceID is service.instance.id (--service-instance-id; the pod's
	// name in the manifests), so that many sidecars reporting to one
	// collector stay apart; empty takes a random id per process.
	InstanceID string
}

// Instance is service.instance.id as the resource has it.
func (id Identity) Instance() string {
	if id.InstanceID == "" {
		return processInstanceID()
	}
	return id.InstanceID
}

// newResource is the resource of every signal: service.name,
// service.version and service.instance.id, under what
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES say (the user's word
// wins). A malformed OTEL_RESOURCE_ATTRIBUTES entry is logged; the rest
// still holds.
func newResource(id Identity, log *slog.Logger) *resource.Resource {
	res, err := resource.New(context.Background(),
		resource.WithAttributes(semconv.ServiceName(DefaultServiceName), semconv.ServiceVersion(id.ServiceVersion),
			semconv.ServiceInstanceID(id.Instance())),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK())
	if err != nil {
		log.Warn("some OpenTelemetry resource attributes were not read", "err", err)
	}
	return res
}

// NewLogExporter makes the exporter of the usage records' log records as
// o says: o's replacement, or OTLP over the logs' protocol; nil when the
// logs are off. The exporter's own retries are off: the usage delivery
// retries from its spool, with its own backoff, so that a record's fate
// is counted once. It connects lazily, and reads its own
// OTEL_EXPORTER_OTLP_LOGS_* variables (headers, timeout, compression,
// certificates).
func NewLogExporter(o OTLP) (sdklog.Exporter, error) {
	switch {
	case !o.Logs.On:
		return nil, nil
	case o.LogExporter != nil:
		return o.LogExporter, nil
	case o.Logs.Protocol == ProtocolHTTP:
		opts := []otlploghttp.Option{otlploghttp.WithRetry(otlploghttp.RetryConfig{Enabled: false})}
		if o.Logs.Endpoint != "" {
			opts = append(opts, otlploghttp.WithEndpointURL(o.Logs.Endpoint))
		}
		return otlploghttp.New(context.Background(), opts...)
	}
	opts := []otlploggrpc.Option{otlploggrpc.WithRetry(otlploggrpc.RetryConfig{Enabled: false})}
	if o.Logs.Endpoint != "" {
		opts = append(opts, otlploggrpc.WithEndpointURL(o.Logs.Endpoint))
	}
	return otlploggrpc.New(context.Background(), opts...)
}

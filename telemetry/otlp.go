package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
)

// What traces and metrics share of OTLP: when a signal is on, which
// protocol it speaks, and the resource that names the sidecar.

// otlpOn tells whether an OTLP signal (TRACES, METRICS) is switched on:
// an endpoint, by flag or by variable; OTEL_SDK_DISABLED=true, or
// OTEL_<signal>_EXPORTER=none without a flag, turn it off. Unlike an SDK,
// the sidecar does not send to localhost when nothing is set: every
// signal is opt-in.
func otlpOn(endpoint, signal string) bool {
	if sdkDisabled() {
		return false
	}
	if endpoint != "" {
		return true
	}
	if strings.EqualFold(os.Getenv("OTEL_"+signal+"_EXPORTER"), "none") {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != ""
}

// sdkDisabled: OTEL_SDK_DISABLED=true turns every signal off.
func sdkDisabled() bool { return strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") }

// otlpProtocol is the protocol a signal speaks: the flag's, else
// OTEL_EXPORTER_OTLP_<signal>_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL,
// else DefaultProtocol.
func otlpProtocol(flag, signal string) (string, error) {
	p := flag
	for _, name := range []string{"OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p == "" {
			p = os.Getenv(name)
		}
	}
	switch p {
	case "":
		return DefaultProtocol, nil
	case ProtocolGRPC, ProtocolHTTP:
		return p, nil
	}
	return "", fmt.Errorf("OTLP %s protocol %q: want %q or %q (the Go exporters have no http/json)",
		strings.ToLower(signal), p, ProtocolGRPC, ProtocolHTTP)
}

// processInstanceID is this process's service.instance.id when none is
// configured: a random UUID, as the conventions recommend, the same for
// traces and metrics.
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

// newResource is the resource of every signal: service.name,
// service.version and service.instance.id, under what
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES say (the user's word
// wins). A malformed OTEL_RESOURCE_ATTRIBUTES entry is logged; the rest
// still holds.
func newResource(id Identity, log *slog.Logger) *resource.Resource {
	instance := id.InstanceID
	if instance == "" {
		instance = processInstanceID()
	}
	res, err := resource.New(context.Background(),
		resource.WithAttributes(semconv.ServiceName(DefaultServiceName), semconv.ServiceVersion(id.ServiceVersion),
			semconv.ServiceInstanceID(instance)),
		resource.WithFromEnv(),
		resource.WithTelemetrySDK())
	if err != nil {
		log.Warn("some OpenTelemetry resource attributes were not read", "err", err)
	}
	return res
}

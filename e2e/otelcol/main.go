// Command otelcol is the OpenTelemetry Collector the e2e tests send OTLP
// to: only the otlp receiver and the file exporter, so it builds in a
// fraction of a full distribution's time. The tests read what arrived from
// the files it writes.
package main

import (
	"context"
	"log"

	"github.com/open-telemetry/opentelemetry-collector-contrib/exporter/fileexporter"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// components is all the collector can run: OTLP in over gRPC and HTTP,
// OTLP/JSON lines out to files.
func components() (otelcol.Factories, error) {
	var f otelcol.Factories
	var err error
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	if f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](fileexporter.NewFactory()); err != nil {
		return f, err
	}
	// The collector's own telemetry is a logger alone, of warnings and
	// worse, to stderr (which the tests show when they fail). Its config is
	// empty: a collector config has no service.telemetry section.
	f.Telemetry = telemetry.NewFactory(func() component.Config { return &struct{}{} },
		telemetry.WithCreateLogger(func(context.Context, telemetry.LoggerSettings, component.Config) (*zap.Logger, component.ShutdownFunc, error) {
			l, err := zap.NewProduction(zap.IncreaseLevel(zapcore.WarnLevel))
			return l, nil, err
		}))
	return f, nil
}

func main() {
	info := component.BuildInfo{Command: "otelcol-e2e", Description: "timing-sidecar's test collector", Version: "v0.161.0"}
	cmd := otelcol.NewCommand(otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: components,
		// Config comes from a file the test writes, and from nowhere else.
		ConfigProviderSettings: otelcol.ConfigProviderSettings{ResolverSettings: confmap.ResolverSettings{
			DefaultScheme:     "file",
			ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
		}},
	})
	if err := cmd.Execute(); err != nil {
		log.Fatal(err)
	}
}

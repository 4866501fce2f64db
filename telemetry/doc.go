// Package telemetry is what is observed of requests: Prometheus series
// (latency histograms, request, token and failure counters, goodput
// against the latency objectives, the sidecar's own delay per stream
// event), one access-log line per request, and, over OTLP when on, each
// measured request's spans and the OpenTelemetry GenAI metrics of every
// request to a GenAI endpoint, failed ones included. A finished request is
// recorded in O(1) and without allocating; per stream event, only the
// relay delay's histogram is observed. The admin port's handler serves the
// series with the process's health and readiness (AdminHandler); whether
// the engine is ready is the proxy's to say.
package telemetry

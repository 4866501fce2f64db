// Package grafana builds the sidecar's Grafana dashboard as code, with the
// Grafana Foundation SDK. timing-sidecar.json beside it is its output;
// `go test ./deploy/grafana -update` writes it again, and the test fails
// while the two differ.
package grafana

//lint:file-ignore SA1019 The SDK marks the classic dashboard model deprecated in favour of v2, which only Grafana 12 with its new-layouts feature imports; the classic JSON imports into every Grafana in use.

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/timing-sidecar/timing-sidecar/telemetry"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// UID is the dashboard's uid, stable across versions so an import
// replaces the previous one.
const UID = "timing-sidecar"

// Selectors every query narrows by: the dashboard's namespace and pod
// variables (labels a Kubernetes scrape adds; a value of ".*" also matches
// a series without them), and the model.
const (
	pods = `namespace=~"$namespace", pod=~"$pod"`
	// models selects the client-facing series: a leg of a request split
	// over two engines counts in its own series, and the whole request
	// once at the sidecar in front (series without leg are older
	// sidecars').
	models = pods + `, model=~"$model", leg!~"prefill|decode"`
	// sidecarOnly keeps the process series of sidecar targets only: the
	// pod's other targets (vLLM's own /metrics) have the same names.
	sidecarOnly = ` and on (namespace, pod, instance, job) timing_sidecar_in_flight_requests`
)

var datasource = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// query is one Prometheus target.
func query(expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().Datasource(datasource).Expr(expr).LegendFormat(legend).Range()
}

// quantiles is a target per quantile of one histogram, by model.
func quantiles(histogram string, qs ...float64) []*prometheus.DataqueryBuilder {
	var out []*prometheus.DataqueryBuilder
	for _, q := range qs {
		expr := fmt.Sprintf(`histogram_quantile(%g, sum by (le, model) (rate(%s_bucket{%s}[$__rate_interval])))`, q, histogram, models)
		out = append(out, query(expr, fmt.Sprintf("p%g {{model}}", q*100)))
	}
	return out
}

func panel(title, description, unit string, targets ...*prometheus.DataqueryBuilder) *timeseries.PanelBuilder {
	p := timeseries.NewPanelBuilder().Title(title).Description(description).Unit(unit).Datasource(datasource).
		Span(12).Height(8).Min(0).
		Legend(common.NewVizLegendOptionsBuilder().ShowLegend(true).DisplayMode(common.LegendDisplayModeList).Placement(common.LegendPlacementBottom))
	for _, t := range targets {
		p.WithTarget(t)
	}
	return p
}

func variable(name, label, query string) *dashboard.QueryVariableBuilder {
	return dashboard.NewQueryVariableBuilder(name).Label(label).
		Query(dashboard.StringOrMap{String: cog.ToPtr(query)}).Definition(query).
		Datasource(datasource).Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Multi(true).IncludeAll(true).AllValue(".*").Sort(dashboard.VariableSortAlphabeticalAsc)
}

// poolingEndpoints is the endpoint label values of the pooling endpoints,
// as a regular expression.
const poolingEndpoints = telemetry.EndpointEmbeddings + "|" + telemetry.EndpointPooling + "|" + telemetry.EndpointClassify + "|" +
	telemetry.EndpointScore + "|" + telemetry.EndpointRerank

// Dashboard builds the dashboard.
func Dashboard() (dashboard.Dashboard, error) {
	b := dashboard.NewDashboardBuilder("timing-sidecar: LLM requests").Uid(UID).
		Description("Per-request timing of an OpenAI-compatible engine, measured by timing-sidecar: latency, throughput, goodput against the latency objectives, errors, and the sidecar itself.").
		Tags([]string{"timing-sidecar", "llm", "vllm"}).
		Time("now-1h", "now").Refresh("30s").Timezone(common.TimeZoneBrowser).
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Data source").Type("prometheus")).
		WithVariable(variable("namespace", "Namespace", `label_values(timing_sidecar_requests_total, namespace)`)).
		WithVariable(variable("pod", "Pod", `label_values(timing_sidecar_requests_total{namespace=~"$namespace"}, pod)`)).
		WithVariable(variable("model", "Model", `label_values(timing_sidecar_requests_total{`+pods+`}, model)`))

	b.WithRow(dashboard.NewRowBuilder("Traffic and goodput"))
	b.WithPanel(panel("Requests per second", "Requests handled, by model and status (499: the client left before a response).", "reqps",
		query(`sum by (model, status) (rate(timing_sidecar_requests_total{`+models+`}[$__rate_interval]))`, "{{model}} {{status}}")))
	b.WithPanel(panel("Goodput", "Share of judged requests that met every latency objective set (--slo-ttft, --slo-itl, --slo-e2e), by model. Empty without objectives.", "percentunit",
		query(`sum by (model) (rate(timing_sidecar_slo_requests_total{`+models+`, result="met"}[$__rate_interval])) / sum by (model) (rate(timing_sidecar_slo_requests_total{`+models+`}[$__rate_interval]))`, "{{model}}")).Max(1))

	b.WithRow(dashboard.NewRowBuilder("Latency"))
	b.WithPanel(panel("Time to first token", "Arrival at the sidecar to the first token event, queue included (as vLLM's histogram counts it); streams.", "s",
		quantiles("timing_sidecar_time_to_first_token_seconds", 0.5, 0.9, 0.99)...))
	b.WithPanel(panel("Time to first answer token", "Arrival to the first content token, past any reasoning: what a user of a reasoning model waits for.", "s",
		quantiles("timing_sidecar_time_to_first_content_token_seconds", 0.5, 0.99)...))
	b.WithPanel(panel("Inter-token latency", "Each stream's mean gap between tokens (p50, p99), and its largest gap (max p99): stalls in the middle of generation.", "s",
		append(quantiles("timing_sidecar_inter_token_latency_seconds", 0.5, 0.99),
			query(`histogram_quantile(0.99, sum by (le, model) (rate(timing_sidecar_max_inter_token_latency_seconds_bucket{`+models+`}[$__rate_interval])))`, "max p99 {{model}}"))...))
	b.WithPanel(panel("End-to-end latency", "Arrival to the end of the response.", "s",
		quantiles("timing_sidecar_e2e_request_latency_seconds", 0.5, 0.9, 0.99)...))
	b.WithPanel(panel("Queue time", "Arrival to the engine's response headers: time waiting for the engine to take the request; streams.", "s",
		quantiles("timing_sidecar_queue_time_seconds", 0.5, 0.99)...))
	b.WithPanel(panel("TTFT by prompt cache", "Time to first token (p50, p99) by how much of the prompt the engine's prefix cache served: none, partial, full (all but at most 16 tokens), unknown (the engine does not report cached tokens). The usual cause when TTFT moves.", "s",
		query(`histogram_quantile(0.5, sum by (le, cache) (rate(timing_sidecar_time_to_first_token_seconds_bucket{`+models+`}[$__rate_interval])))`, "p50 {{cache}}"),
		query(`histogram_quantile(0.99, sum by (le, cache) (rate(timing_sidecar_time_to_first_token_seconds_bucket{`+models+`}[$__rate_interval])))`, "p99 {{cache}}")))
	b.WithPanel(panel("Prompt cache hit ratio", "Share of prompt tokens the engine read from its prefix cache, by model. Only engines that report cached tokens add to the cached side.", "percentunit",
		query(`sum by (model) (rate(timing_sidecar_cached_prompt_tokens_total{`+models+`}[$__rate_interval])) / sum by (model) (rate(timing_sidecar_prompt_tokens_total{`+models+`}[$__rate_interval]))`, "{{model}}")).Max(1))
	b.WithPanel(panel("Prefill speed", "Prompt tokens the engine computed (prompt - cached) per second, from arrival to first token, less the engine's queue time when it reports one (p50, p10: the slow end); streams of engines that report cached tokens.", "none",
		query(`histogram_quantile(0.5, sum by (le, model) (rate(timing_sidecar_prefill_tokens_per_second_bucket{`+models+`}[$__rate_interval])))`, "p50 {{model}}"),
		query(`histogram_quantile(0.1, sum by (le, model) (rate(timing_sidecar_prefill_tokens_per_second_bucket{`+models+`}[$__rate_interval])))`, "p10 {{model}}")))
	b.WithPanel(panel("Decode speed per stream", "Tokens per second one stream receives: 1 / median inter-token latency.", "none",
		query(`1 / histogram_quantile(0.5, sum by (le, model) (rate(timing_sidecar_inter_token_latency_seconds_bucket{`+models+`}[$__rate_interval])))`, "{{model}}")))

	b.WithPanel(panel("Embeddings and rerank", "End-to-end latency (p50, p99) of the pooling endpoints (embeddings, pooling, classify, score, rerank), by endpoint: their answers come whole, so this is the engine's computation and the network. Empty without such traffic.", "s",
		query(`histogram_quantile(0.5, sum by (le, endpoint) (rate(timing_sidecar_e2e_request_latency_seconds_bucket{`+models+`, endpoint=~"`+poolingEndpoints+`"}[$__rate_interval])))`, "p50 {{endpoint}}"),
		query(`histogram_quantile(0.99, sum by (le, endpoint) (rate(timing_sidecar_e2e_request_latency_seconds_bucket{`+models+`, endpoint=~"`+poolingEndpoints+`"}[$__rate_interval])))`, "p99 {{endpoint}}")))

	b.WithRow(dashboard.NewRowBuilder("Tokens"))
	b.WithPanel(panel("Tokens per second by model", "Prompt and generated tokens, from the engine's usage.", "none",
		query(`sum by (model) (rate(timing_sidecar_prompt_tokens_total{`+models+`}[$__rate_interval]))`, "prompt {{model}}"),
		query(`sum by (model) (rate(timing_sidecar_generation_tokens_total{`+models+`}[$__rate_interval]))`, "generated {{model}}")))
	b.WithPanel(panel("Tokens per second by tenant", "With --tenant-header and --tenant-label; one unnamed series otherwise.", "none",
		query(`sum by (tenant) (rate(timing_sidecar_prompt_tokens_total{`+models+`}[$__rate_interval]))`, "prompt {{tenant}}"),
		query(`sum by (tenant) (rate(timing_sidecar_generation_tokens_total{`+models+`}[$__rate_interval]))`, "generated {{tenant}}")))

	b.WithRow(dashboard.NewRowBuilder("Errors and the sidecar"))
	b.WithPanel(panel("Engine failures", "Per second, by kind: connect, timeout, closed, bad_response, interrupted, idle_timeout, stream_error.", "reqps",
		query(`sum by (kind) (rate(timing_sidecar_upstream_errors_total{`+pods+`}[$__rate_interval]))`, "{{kind}}")))
	b.WithPanel(panel("Client disconnects and requests in flight", "Clients that left before their response was complete (per second), and requests being handled.", "none",
		query(`sum(rate(timing_sidecar_client_disconnects_total{`+pods+`}[$__rate_interval]))`, "disconnects/s"),
		query(`sum by (pod) (timing_sidecar_in_flight_requests{`+pods+`})`, "in flight {{pod}}")))
	b.WithPanel(panel("Sidecar CPU", "CPU seconds per second of each sidecar process.", "none",
		query(`sum by (pod) (rate(process_cpu_seconds_total{`+pods+`}[$__rate_interval])`+sidecarOnly+`)`, "{{pod}}")))
	b.WithPanel(panel("Sidecar memory", "Resident memory of each sidecar process.", "bytes",
		query(`sum by (pod) (process_resident_memory_bytes{`+pods+`}`+sidecarOnly+`)`, "{{pod}}")))
	b.WithPanel(panel("Sidecar's own delay per event", "Each stream event's time from the kernel receiving it from the engine to its hand-over to the client's socket (p50, p99, by pod). Tens of microseconds when the sidecar has its CPU; climbing towards a CFS period (100 ms) when a CPU limit throttles it, which also merges events and blurs its marks.", "s",
		query(`histogram_quantile(0.5, sum by (le, pod) (rate(timing_sidecar_relay_delay_seconds_bucket{`+pods+`}[$__rate_interval])))`, "p50 {{pod}}"),
		query(`histogram_quantile(0.99, sum by (le, pod) (rate(timing_sidecar_relay_delay_seconds_bucket{`+pods+`}[$__rate_interval])))`, "p99 {{pod}}")))
	b.WithPanel(stat.NewPanelBuilder().Title("Engines ready").Description("Sidecars whose last probe of the engine succeeded, of all.").
		Datasource(datasource).Span(12).Height(4).
		WithTarget(query(`sum(timing_sidecar_engine_ready{`+pods+`}) / count(timing_sidecar_engine_ready{`+pods+`})`, "ready")).Unit("percentunit"))

	armsRow(b)
	return b.Build()
}

// armsRow adds the experiment's arms side by side: each figure by the
// "variant" label (--variant, --variant-header), one series per arm.
func armsRow(b *dashboard.DashboardBuilder) {
	byArm := func(histogram string, q float64) *prometheus.DataqueryBuilder {
		return query(fmt.Sprintf(`histogram_quantile(%g, sum by (le, variant) (rate(%s_bucket{%s}[$__rate_interval])))`, q, histogram, models),
			fmt.Sprintf("p%g {{variant}}", q*100))
	}
	requests := `sum by (variant) (rate(timing_sidecar_requests_total{` + models + `}[$__rate_interval]))`
	b.WithRow(dashboard.NewRowBuilder("Arms"))
	b.WithPanel(panel("TTFT by arm", "Time to first token (p50, p90) of each arm of a latency experiment: the variant label, from --variant or --variant-header. One unnamed series without them.", "s",
		byArm("timing_sidecar_time_to_first_token_seconds", 0.5), byArm("timing_sidecar_time_to_first_token_seconds", 0.9)))
	b.WithPanel(panel("Inter-token latency by arm", "Each stream's mean inter-token latency (p50, p90), by arm.", "s",
		byArm("timing_sidecar_inter_token_latency_seconds", 0.5), byArm("timing_sidecar_inter_token_latency_seconds", 0.9)))
	// 0 where an arm has no 5xx, rather than no series.
	b.WithPanel(panel("Error rate by arm", "Share of each arm's requests answered with a 5xx.", "percentunit",
		query(`(sum by (variant) (rate(timing_sidecar_requests_total{`+models+`, status=~"5.."}[$__rate_interval])) or 0 * `+requests+`) / `+requests, "{{variant}}")).Max(1))
	b.WithPanel(panel("Goodput by arm", "Share of each arm's judged requests that met every latency objective set (--slo-ttft, --slo-itl, --slo-e2e). Empty without objectives.", "percentunit",
		query(`sum by (variant) (rate(timing_sidecar_slo_requests_total{`+models+`, result="met"}[$__rate_interval])) / sum by (variant) (rate(timing_sidecar_slo_requests_total{`+models+`}[$__rate_interval]))`, "{{variant}}")).Max(1))
}

// Expressions lists every PromQL expression of a dashboard's panels (rows'
// included), and the selector inside each variable's label_values query,
// read from the dashboard's JSON as Grafana would import it.
func Expressions(dashboardJSON []byte) ([]string, error) {
	type panel struct {
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dashboardJSON, &d); err != nil {
		return nil, err
	}
	var out []string
	for _, v := range d.Templating.List {
		var q string
		if v.Type != "query" || json.Unmarshal(v.Query, &q) != nil {
			continue
		}
		if inner, ok := strings.CutPrefix(q, "label_values("); ok {
			q = inner[:strings.LastIndex(inner, ",")]
		}
		out = append(out, q)
	}
	var walk func([]json.RawMessage) error
	walk = func(raws []json.RawMessage) error {
		for _, raw := range raws {
			var p panel
			if err := json.Unmarshal(raw, &p); err != nil {
				return err
			}
			for _, t := range p.Targets {
				if t.Expr != "" {
					out = append(out, t.Expr)
				}
			}
			if err := walk(p.Panels); err != nil {
				return err
			}
		}
		return nil
	}
	return out, walk(d.Panels)
}

package proxy

import (
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// route is what the sidecar makes of a request's path: whether it is
// measured, its API (the one choice of a wire format: everything that
// differs between APIs is the API's), and its Prometheus label. Behaviour
// follows the route, never the label string.
type route struct {
	measured bool
	api      rewrite.API
	label    string
	// upload: a multipart upload (audio), read only as far as its form
	// fields before the file; the rest streams to the engine unread.
	upload bool
}

var (
	chatRoute        = route{measured: true, api: rewrite.ChatCompletions, label: telemetry.EndpointChat}
	completionsRoute = route{measured: true, api: rewrite.Completions, label: telemetry.EndpointCompletions}
	messagesRoute    = route{measured: true, api: rewrite.Messages, label: telemetry.EndpointMessages}
	responsesRoute   = route{measured: true, api: rewrite.Responses, label: telemetry.EndpointResponses}
	embeddingsRoute  = route{measured: true, api: rewrite.Pooling, label: telemetry.EndpointEmbeddings}
	poolingRoute     = route{measured: true, api: rewrite.Pooling, label: telemetry.EndpointPooling}
	classifyRoute    = route{measured: true, api: rewrite.Pooling, label: telemetry.EndpointClassify}
	scoreRoute       = route{measured: true, api: rewrite.Pooling, label: telemetry.EndpointScore}
	rerankRoute      = route{measured: true, api: rewrite.Pooling, label: telemetry.EndpointRerank}
	transcribeRoute  = route{measured: true, api: rewrite.Transcriptions, label: telemetry.EndpointTranscriptions, upload: true}
	translateRoute   = route{measured: true, api: rewrite.Transcriptions, label: telemetry.EndpointTranslations, upload: true}
	otherRoute       = route{label: telemetry.EndpointOther}
)

// routeOf is the route of a request path. Only POSTs to a measured route
// are measured; the caller checks the method.
func routeOf(path []byte) route {
	switch string(path) {
	case "/v1/chat/completions":
		return chatRoute
	case "/v1/completions":
		return completionsRoute
	case "/v1/messages":
		return messagesRoute
	case "/v1/responses":
		return responsesRoute
	case "/v1/embeddings":
		return embeddingsRoute
	case "/pooling":
		return poolingRoute
	case "/classify":
		return classifyRoute
	case "/score", "/v1/score":
		return scoreRoute
	case "/rerank", "/v1/rerank", "/v2/rerank":
		return rerankRoute
	case "/v1/audio/transcriptions":
		return transcribeRoute
	case "/v1/audio/translations":
		return translateRoute
	}
	return otherRoute
}

package proxy

import (
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// route is what the sidecar makes of a request's path: whether it is
// measured, the wire format of its responses, and its Prometheus label.
// Behaviour follows the route, never the label string.
type route struct {
	measured bool
	api      rewrite.API
	// chat: Chat Completions; with api APIChat and chat false, the
	// Completions API, which shares its stream format but not its body.
	chat  bool
	label string
}

var (
	chatRoute        = route{measured: true, api: rewrite.APIChat, chat: true, label: telemetry.EndpointChat}
	completionsRoute = route{measured: true, api: rewrite.APIChat, label: telemetry.EndpointCompletions}
	messagesRoute    = route{measured: true, api: rewrite.APIMessages, label: telemetry.EndpointMessages}
	responsesRoute   = route{measured: true, api: rewrite.APIResponses, label: telemetry.EndpointResponses}
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
	}
	return otherRoute
}

// openAI tells the routes of OpenAI's Chat Completions wire format, whose
// requests have stream_options and n and may be upgraded to a stream.
func (r route) openAI() bool { return r.api == rewrite.APIChat }

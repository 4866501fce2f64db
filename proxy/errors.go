package proxy

import (
	"encoding/json"
	"errors"
	"net"

	"github.com/valyala/fasthttp"

	"github.com/timing-sidecar/timing-sidecar/proxy/upstream"
	"github.com/timing-sidecar/timing-sidecar/rewrite"
	"github.com/timing-sidecar/timing-sidecar/telemetry"
)

// apiError is an error the sidecar itself answers, in OpenAI's shape, so
// clients and SDKs handle it like any other API error.
type apiError struct {
	Status  int
	Type    string
	Code    string
	Message string
	Param   string // the request field at fault, if one is
}

// errorBody is OpenAI's error envelope.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	} `json:"error"`
}

func (e apiError) write(ctx *fasthttp.RequestCtx) {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code = e.Message, e.Type, e.Code
	if e.Param != "" {
		b.Error.Param = &e.Param
	}
	body, _ := json.Marshal(b)
	ctx.Response.Reset()
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	ctx.SetBody(body)
}

// upstreamError turns a failure to get response headers from the engine
// into the error the client sees. The message names the kind of failure
// only: the error's text may quote the engine's bytes (another client's
// output) or the request's.
func upstreamError(err error) apiError {
	e := apiError{Status: fasthttp.StatusBadGateway, Type: "upstream_error"}
	switch {
	case errors.Is(err, upstream.ErrBadStatus):
		e.Code, e.Message = "bad_response", "timing-sidecar: the model server answered with a status that is not a final HTTP status"
		return e
	case errors.Is(err, upstream.ErrBadHeaders):
		e.Code, e.Message = "bad_response", "timing-sidecar: the model server's response headers are malformed"
		return e
	}
	switch upstreamErrorKind(err, true) {
	case telemetry.ErrorBadResponse:
		e.Code, e.Message = "upstream_header_too_large", "timing-sidecar: the model server's response headers are larger than --max-response-header-size"
	case telemetry.ErrorTimeout:
		e.Status, e.Code, e.Message = fasthttp.StatusGatewayTimeout, "upstream_timeout", "timing-sidecar: the model server did not answer in time"
	case telemetry.ErrorConnect:
		e.Code, e.Message = "upstream_unavailable", "timing-sidecar: cannot connect to the model server"
	default:
		e.Code, e.Message = "upstream_unavailable", "timing-sidecar: the model server closed the connection or sent a response that cannot be read"
	}
	return e
}

// requestError answers a request fasthttp could not read.
func requestError(err error) apiError {
	var small *fasthttp.ErrSmallBuffer
	var ne net.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return apiError{Status: fasthttp.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
			Message: "timing-sidecar: the request body is larger than the configured maximum (--max-request-body-size)"}
	case errors.As(err, &small):
		return apiError{Status: fasthttp.StatusRequestHeaderFieldsTooLarge, Type: "invalid_request_error", Code: "request_header_too_large",
			Message: "timing-sidecar: the request headers are larger than the configured maximum (--max-request-header-size)"}
	case errors.As(err, &ne) && ne.Timeout():
		return apiError{Status: fasthttp.StatusRequestTimeout, Type: "invalid_request_error", Code: "request_timeout",
			Message: "timing-sidecar: the request was not received in time (--client-read-timeout)"}
	default:
		return apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "bad_request",
			Message: "timing-sidecar: malformed HTTP request"}
	}
}

// safeError is err's message without the bytes fasthttp quotes from a
// message it could not parse, even inside a network error: an engine's
// response (another client's output) or a client's request (its
// credentials). What names addresses and causes stays.
func safeError(err error) string {
	return redactRequestBytes(err.Error())
}

// upstreamErrorKind names an engine failure for the errors counter.
func upstreamErrorKind(err error, beforeHeaders bool) string {
	var ne net.Error
	timeout := errors.Is(err, upstream.ErrHeaderTimeout) || errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout())
	var op *net.OpError
	var small *fasthttp.ErrSmallBuffer
	switch {
	case errors.As(err, &small), errors.Is(err, upstream.ErrBadStatus), errors.Is(err, upstream.ErrBadHeaders):
		return telemetry.ErrorBadResponse
	case !beforeHeaders && timeout:
		return telemetry.ErrorIdleTimeout
	case !beforeHeaders:
		return telemetry.ErrorInterrupted
	case timeout:
		return telemetry.ErrorTimeout
	case errors.As(err, &op) && op.Op == "dial":
		return telemetry.ErrorConnect
	default:
		return telemetry.ErrorClosed
	}
}

// noteStreamError records an engine failure told inside a stream (an
// error event whose code is a 5xx, or none): the status went out as 200
// before it, and without it the failure would count as served.
func noteStreamError(f *flight, ev rewrite.Event) {
	if ev.Kind == rewrite.EventError && f.rec.UpstreamError == "" && rewrite.ErrorStatus(ev.Data) >= 500 {
		f.rec.UpstreamError = telemetry.ErrorStream
	}
}

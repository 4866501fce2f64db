package proxy

import (
	"bytes"

	"github.com/timing-sidecar/timing-sidecar/proxy/framing"
	"github.com/valyala/fasthttp"
)

// checkRequest refuses what fasthttp accepts but a proxy must not forward:
// anything that lets the engine read the request's bytes differently from
// the sidecar (request smuggling, RFC 9112 sections 6.1 and 6.3), and
// requests no engine serves. It returns nil for a request that may go on.
// One pass over the raw header block, which fasthttp keeps as received.
func checkRequest(h *fasthttp.RequestHeader) *apiError {
	switch p := h.Protocol(); {
	case string(p) != "HTTP/1.1" && string(p) != "HTTP/1.0":
		return &apiError{Status: fasthttp.StatusHTTPVersionNotSupported, Type: "invalid_request_error",
			Code: "http_version_not_supported", Message: "timing-sidecar: only HTTP/1.1 and HTTP/1.0 are served"}
	case h.IsConnect():
		// A tunnel would carry bytes the sidecar cannot see to the engine.
		return &apiError{Status: fasthttp.StatusMethodNotAllowed, Type: "invalid_request_error",
			Code: "method_not_allowed", Message: "timing-sidecar: CONNECT is not served"}
	}
	if target := h.RequestURI(); bytes.IndexByte(target, '#') >= 0 || !validEscapes(target) {
		// A fragment is never sent (RFC 9112 section 3.2); an escape
		// that is not one is decoded differently by different servers.
		return badRequest("the request target is malformed")
	}
	if pr := framing.Check(h.RawHeaders()); pr != nil {
		return &apiError{Status: pr.Status, Type: "invalid_request_error", Code: pr.Code, Message: "timing-sidecar: " + pr.Message}
	}
	return nil
}

func badRequest(why string) *apiError {
	return &apiError{Status: fasthttp.StatusBadRequest, Type: "invalid_request_error", Code: "bad_request",
		Message: "timing-sidecar: " + why}
}

// validEscapes tells whether every percent sign in the target's path is
// followed by two hex digits (RFC 3986 section 2.1), as a parser that
// decodes the path (Go's, Python's frameworks') needs: engines would read
// such a target differently, or refuse it.
func validEscapes(target []byte) bool {
	if q := bytes.IndexByte(target, '?'); q >= 0 {
		target = target[:q]
	}
	for i := bytes.IndexByte(target, '%'); i >= 0; i = bytes.IndexByte(target, '%') {
		if len(target) < i+3 || !isHex(target[i+1]) || !isHex(target[i+2]) {
			return false
		}
		target = target[i+3:]
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// originForm is the request target to send the engine: origin-form
// (path and query) whatever form the client used. An absolute-form target
// ("http://host/path") is cut to its path, as RFC 9112 section 3.2.2 has
// a server read it (fasthttp has already taken its host as the Host).
func originForm(target []byte) []byte {
	if len(target) == 0 || target[0] == '/' || string(target) == "*" {
		return target
	}
	i := bytes.Index(target, []byte("://"))
	if i < 0 {
		return target
	}
	rest := target[i+3:]
	end := bytes.IndexAny(rest, "/?#")
	switch {
	case end < 0:
		return []byte("/")
	case rest[end] == '/':
		return rest[end:]
	case rest[end] == '?':
		return append([]byte("/"), rest[end:]...)
	}
	return []byte("/")
}

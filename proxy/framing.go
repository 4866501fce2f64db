package proxy

import (
	"bytes"

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
	return checkFraming(h.RawHeaders())
}

// checkFraming reads the raw header block for what says where the body
// ends: exactly one way of saying it, and names that parse one way only.
func checkFraming(raw []byte) *apiError {
	lengths, codings := 0, 0
	chunkedLast, otherCoding := false, false
	for line := range bytes.Lines(raw) {
		line = bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'})
		if len(line) == 0 {
			continue
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			// A name with a space (or a folded line) is read differently by
			// different parsers: RFC 9112 section 5.1 says refuse it.
			return badRequest("a header field name is malformed")
		}
		name := line[:colon]
		switch {
		case len(name) == len("Content-Length") && bytes.EqualFold(name, []byte("Content-Length")):
			lengths++
		case len(name) == len("Transfer-Encoding") && bytes.EqualFold(name, []byte("Transfer-Encoding")):
			codings++
			chunkedLast, otherCoding = readCodings(line[colon+1:], chunkedLast, otherCoding)
		}
	}
	switch {
	case codings > 0 && lengths > 0:
		return badRequest("the request has both Content-Length and Transfer-Encoding")
	case lengths > 1:
		return badRequest("the request has more than one Content-Length")
	case codings > 0 && otherCoding:
		return &apiError{Status: fasthttp.StatusNotImplemented, Type: "invalid_request_error", Code: "unsupported_transfer_coding",
			Message: "timing-sidecar: the only transfer coding served is chunked"}
	case codings > 0 && !chunkedLast:
		// Transfer-Encoding: identity, which fasthttp reads as no body at
		// all: the body would then be read as the next request.
		return badRequest("Transfer-Encoding must end with chunked")
	}
	return nil
}

// framedOneWay tells whether an engine's response header fields say one
// thing about where the body ends, to any parser, as checkFraming asks of
// requests: field names that are tokens, not both a Content-Length and a
// Transfer-Encoding, one Content-Length, and chunked as the last coding.
func framedOneWay(fields []byte) bool {
	return checkFraming(fields) == nil
}

// readCodings reads one Transfer-Encoding value on top of those before it:
// whether chunked is now the last coding, and whether any coding other
// than chunked (and the no-op identity) has appeared.
func readCodings(value []byte, chunkedLast, otherCoding bool) (bool, bool) {
	for coding := range bytes.SplitSeq(value, []byte{','}) {
		coding = bytes.TrimSpace(coding)
		if len(coding) == 0 {
			continue
		}
		chunked := bytes.EqualFold(coding, []byte("chunked"))
		if chunkedLast || !chunked {
			// Something after chunked, or a coding other than it.
			otherCoding = otherCoding || !bytes.EqualFold(coding, []byte("identity"))
		}
		chunkedLast = chunked
	}
	return chunkedLast, otherCoding
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

// isToken tells whether b is an RFC 9110 token (a valid field name).
func isToken(b []byte) bool {
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return len(b) > 0
}

var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

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

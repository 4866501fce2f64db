package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// hopHeaders are meaningful for one connection only and are never
// forwarded, in either direction (RFC 9110 7.6.1, plus the de-facto
// Proxy-Connection and Keep-Alive).
var hopHeaders = [...]string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

var hopHeaderBytes = func() (b [len(hopHeaders)][]byte) {
	for i, h := range hopHeaders {
		b[i] = []byte(h)
	}
	return b
}()

// header is what fasthttp's request and response headers have in common.
type header interface {
	// PeekKeys, not All: an iterator through an interface allocates.
	PeekKeys() [][]byte
	PeekAll(key string) [][]byte
	Del(key string)
	ResetConnectionClose()
}

// removeHopHeaders removes hop-by-hop headers and every header named in
// Connection. One pass finds which are there (usually none), so the common
// request costs no deletions.
func removeHopHeaders(h header) {
	var found [len(hopHeaders)]bool
	anyFound := false
	for _, k := range h.PeekKeys() {
		for i, name := range hopHeaderBytes {
			if len(k) == len(name) && bytes.EqualFold(k, name) {
				found[i], anyFound = true, true
			}
		}
	}
	h.ResetConnectionClose()
	if !anyFound {
		return
	}
	for _, v := range h.PeekAll("Connection") {
		for name := range bytes.SplitSeq(v, []byte{','}) {
			// The request id is the sidecar's, end to end, whatever a
			// client lists in Connection.
			if name = bytes.TrimSpace(name); len(name) > 0 && !bytes.EqualFold(name, requestIDHeader) {
				h.Del(string(name))
			}
		}
	}
	for i, name := range hopHeaders {
		if found[i] {
			h.Del(name)
		}
	}
}

// upstreamRequest fills req from the client's request, with body as its
// body. identity asks the engine for an unencoded response, which the
// sidecar must read.
func upstreamRequest(req *fasthttp.Request, ctx *fasthttp.RequestCtx, identity bool, upstreamHost string) {
	ctx.Request.Header.CopyTo(&req.Header)
	// fasthttp would add "Content-Type: application/octet-stream" to a body
	// without one, and FastAPI engines then refuse the JSON.
	req.Header.SetNoDefaultContentType(true)
	removeHopHeaders(&req.Header)
	if len(req.Header.Host()) == 0 {
		// HTTP/1.0 clients may send no Host; HTTP/1.1 requires one.
		req.Header.SetHost(upstreamHost)
	}
	// The sidecar holds the whole body already; the engine need not
	// invite it.
	req.Header.Del("Expect")
	if identity {
		// Said, not left out: without the header any coding is acceptable.
		req.Header.Set("Accept-Encoding", "identity")
	}
	// The engine sees the client's address, as behind any reverse proxy.
	req.Header.Add("X-Forwarded-For", ctx.RemoteIP().String())
	req.UseHostHeader = true
	req.URI().DisablePathNormalizing = true
	req.SetRequestURIBytes(originForm(ctx.RequestURI()))
	// The body, and its length, are the exchange's to set, for each
	// attempt (send).
}

// copyResponseHeader sets the client response's status and headers from
// the engine's, without hop-by-hop headers. It adds header by header rather
// than with CopyTo, which would reset the server's "no default Date or
// Content-Type" settings: the engine's headers pass as they are.
func copyResponseHeader(ctx *fasthttp.RequestCtx, resp *fasthttp.Response) {
	h := &ctx.Response.Header
	h.SetStatusCode(resp.StatusCode())
	h.SetStatusMessage(resp.Header.StatusMessage())
	for k, v := range resp.Header.All() {
		h.AddBytesKV(k, v)
	}
	removeHopHeaders(h)
}

// isEventStream tells whether a response is server-sent events. Media
// types are case-insensitive (RFC 9110 section 8.3.1).
func isEventStream(resp *fasthttp.Response) bool {
	ct := resp.Header.ContentType()
	const sse = "text/event-stream"
	return len(ct) >= len(sse) && bytes.EqualFold(ct[:len(sse)], []byte(sse))
}

// isEncoded reports a response body with a content coding the sidecar
// cannot splice into.
func isEncoded(resp *fasthttp.Response) bool {
	ce := resp.Header.ContentEncoding()
	return len(ce) > 0 && !bytes.EqualFold(ce, []byte("identity"))
}

// setResponseID returns the request id to the client.
func setResponseID(ctx *fasthttp.RequestCtx, f *flight) {
	ctx.Response.Header.SetBytesKV(requestIDHeader, []byte(f.rec.ID))
}

// dropTrailers removes the fields of a chunked request's trailer section,
// keeping any header of the same name. Trailers are not headers (RFC 9110
// §6.5.1): read as headers, they would let a client behind a gateway that
// filters headers but passes trailers choose its tenant or request id. The
// engine gets the body with a Content-Length, which has no trailer section,
// so they are dropped rather than forwarded. fasthttp keeps them apart but
// answers Peek from them when no header has the name, and moves them into
// the headers when the Trailer field is deleted.
func dropTrailers(h *fasthttp.RequestHeader) {
	if len(h.PeekTrailerKeys()) == 0 {
		return
	}
	var keys []string
	for k := range h.Trailers() {
		keys = append(keys, string(k))
	}
	for _, k := range keys {
		trailers := len(h.PeekAllTrailer(k))
		all := h.PeekAll(k) // the header section's values, then the trailer's; reuses the buffer PeekAllTrailer returned
		var headers []string
		for _, v := range all[:len(all)-trailers] {
			headers = append(headers, string(v))
		}
		h.Del(k)
		for _, v := range headers {
			h.Add(k, v)
		}
	}
	h.Del(fasthttp.HeaderTrailer)
}

// serverTimingSize holds the sidecar's Server-Timing entries (four
// figures of at most a dozen digits), so that formatting them allocates
// nothing.
const serverTimingSize = 128

// addServerTiming adds the sidecar's Server-Timing entries after the
// engine's own (the field is a list); none measured, no field.
func addServerTiming(h *fasthttp.ResponseHeader, entries []byte) {
	if len(entries) > 0 {
		h.AddBytesV("Server-Timing", entries)
	}
}

// Package framing checks an HTTP/1.1 header block for one reading of
// where its body ends (RFC 9112 sections 5.1, 6.1 and 6.3): a request the
// engine could read differently from the sidecar is a smuggled request,
// and a response the client could read differently from the sidecar is a
// smuggled response. The client's requests and the engine's responses are
// checked alike.
package framing

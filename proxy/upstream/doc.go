// Package upstream is the sidecar's client for the engine: a pool of
// keep-alive HTTP/1.1 connections it dials itself (plain or TLS, each
// read through a receive-stamped netclock.Conn), and the exchange of one
// request and its response on one of them. An exchange can be aborted at
// any moment, also while it waits for headers, by closing its connection:
// that is how the engine learns a client left. fasthttp's request and
// response types do the HTTP encoding and parsing; a response whose
// header block parsers could read more than one way, or whose status is
// not a final HTTP status, is refused before any byte reaches the client.
package upstream

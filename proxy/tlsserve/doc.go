// Package tlsserve is the TLS the sidecar serves its clients with (the
// --ssl-* flags, as vLLM names them): the certificate and the client CA
// read from files and re-read when they change, as a Kubernetes Secret's
// rotation changes the mounted files, without a handshake ever waiting on
// the disk. testpki makes the certificates its tests and the proxy's use.
//
// It imports nothing of the sidecar's.
package tlsserve

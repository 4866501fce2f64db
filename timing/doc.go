// Package timing holds a request's clock marks and turns them, with the
// engine's token counts, into the per-request metrics object, and that
// object into the views of it a response carries: its JSON and the W3C
// Server-Timing entries.
//
// It is pure: it reads no clock and no network (the marks are given to
// it), and imports nothing of the sidecar's.
package timing

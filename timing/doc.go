// Package timing holds a request's clock marks and turns them, with the
// engine's token counts, into the per-request metrics object.
package timing

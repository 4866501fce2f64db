// Package readahead reads an engine's event stream ahead of a client that
// stalled: a goroutine keeps reading the engine's side, each read with its
// own receive time, into a bounded ring that the relay drains as the
// client catches up. The engine's marks stay the engine's while the client
// is slow; only past the bound does the engine wait for the client again.
// Each read out of the ring ends within one engine read and carries that
// read's receive time, so events the engine sent apart stay apart.
//
// It imports nothing of the sidecar's.
package readahead

//go:build !unix

package netclock

// peeker exists on Unix only.
type peeker struct{}

// Alive cannot peek without blocking here; a stale connection is caught by
// the retry in RoundTrip instead.
func (c *Conn) Alive() bool { return true }

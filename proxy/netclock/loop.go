package netclock

import (
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/timing-sidecar/timing-sidecar/proxy/readloop"
)

// loopRead is what a read on a loop (readloop.Task) needs beside the
// socket: the task, and what ends its wait early. Close and the deadlines
// may come from any goroutine; each wakes the task after it is set.
type loopRead struct {
	task     atomic.Pointer[readloop.Task]
	stop     atomic.Bool  // the connection is closing
	deadline atomic.Int64 // readloop.Deadline's; 0 for none
}

// The errors of a read ended on a loop: what Go's poller returns.
var (
	errLoopClosed  = &net.OpError{Op: "raw-read", Net: "tcp", Err: net.ErrClosed}
	errLoopTimeout = &net.OpError{Op: "raw-read", Net: "tcp", Err: os.ErrDeadlineExceeded}
)

// maxStreak bounds the reads on a loop that each fill the caller's
// buffer before one waits its turn: an engine sending faster than the
// stream is relayed does not keep the loop's other streams waiting.
const maxStreak = 16

// LoopReads makes c's reads wait on t's loop while t runs there; nil
// undoes it. It tells whether they can: only receive-stamped reads do.
// For the reader, between reads.
func (c *Conn) LoopReads(t *readloop.Task) bool {
	if c.kernel == nil {
		return false
	}
	c.loop.task.Store(t)
	return true
}

// LoopWrites makes a write to c that finds no room take t off its loop
// first (readloop.Task.Leave); nil undoes it. It tells whether it can:
// only raw socket writes do. For the writer, between writes, and only
// where the writer is the only one to write to c.
func (c *Conn) LoopWrites(t *readloop.Task) bool {
	if c.sender == nil {
		return false
	}
	c.sender.task = t
	return true
}

// SetReadDeadline sets the read deadline, for a read waiting on a loop
// too.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.loop.deadline.Store(readloop.Deadline(t))
	c.loop.task.Load().Wake()
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline sets both deadlines, the read's for a loop's too.
func (c *Conn) SetDeadline(t time.Time) error {
	c.loop.deadline.Store(readloop.Deadline(t))
	c.loop.task.Load().Wake()
	return c.Conn.SetDeadline(t)
}

// Close closes c; a read waiting on a loop returns net.ErrClosed. The
// socket closes once that read has returned, as Go's poller has it: so
// a task on a loop must not close another's connection (see readloop).
func (c *Conn) Close() error {
	c.loop.stop.Store(true)
	c.loop.task.Load().Wake()
	return c.Conn.Close()
}

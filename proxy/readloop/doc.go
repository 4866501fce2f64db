// Package readloop runs the reads of many event streams on a few
// goroutines, as nginx's workers do: each loop waits on an epoll set of
// its own, level-triggered, and a stream reads its engine's socket once
// per arrival. Go's poller cannot: it forgets a socket's readiness
// before every read, so each event costs a second read that finds
// nothing (EAGAIN), and a goroutine parked and woken.
//
// A stream's relay stays the blocking-style code it is: it runs as a
// coroutine (iter.Pull) of a loop, and a read that would wait yields to
// the loop instead (Task.WaitReadable), which resumes it when the epoll
// set says its socket has bytes, its deadline passed, or Wake was called
// (the connection closed, its deadline moved). The loop parks in Go's
// poller on the epoll set's own descriptor, so a loop with nothing to do
// holds no thread.
//
// A stream that must block on anything else (a client that does not
// read: its socket's buffer full) first leaves its loop (Task.Leave):
// the goroutine that called Run carries it on, the ordinary way, to its
// end, and the loop's other streams never wait on it.
//
// What runs on a loop must never wait on another of its tasks: closing
// a connection whose read waits on a loop waits until the loop has
// resumed that read (netclock.Conn.Close), so a task that closed another
// stream's connection could stall its loop for good. Closes come from the
// stream's own goroutine, the client watcher, or Shutdown. Nor may a task
// call runtime.Goexit (t.FailNow in a test): iter.Pull passes it on to
// the loop's goroutine.
package readloop

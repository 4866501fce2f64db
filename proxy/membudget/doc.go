// Package membudget bounds the bytes the sidecar holds at once for requests'
// bodies (--max-body-memory): request bodies read to be inspected and
// edited, responses held past their first 64 KiB, and the read-aheads of
// streams whose client stalled. A pod's memory limit is shared by every
// request in it: without a bound, two uploads at the body size limit took
// the container past its limit and every stream in the pod died with it.
// What the budget does not cover passes through: a request body with no
// room in time goes to the engine as it arrives, unread, and is answered
// unmeasured for the metrics object (its timing is still recorded), as a
// body the sidecar does not understand is; a held response with no room
// passes through without metrics; a stream without room for a read-ahead
// waits on its client as before. Nothing is refused for memory, so
// nothing the engine would serve fails because of the sidecar.
//
// Room is taken as it is needed (a body as its bytes arrive), and only a
// request body's first take waits: one that holds room never waits for
// more, so two cannot wait on each other. A take that does not wait
// never queues behind one that does.
//
// Bodies that fasthttp read with the headers are the connection's own
// buffer, counted per connection in deploy/README.md's formula, not here.
//
// It imports nothing of the sidecar's.
package membudget

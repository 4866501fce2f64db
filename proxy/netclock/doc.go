// Package netclock has the connections the sidecar's marks are taken on:
// TCP connections that know when the bytes of their latest read reached
// the machine (the kernel's receive time where Linux gives it, the clock
// at the read elsewhere), and, for a client's, how long writes waited on
// a full send buffer, the client's own pace. Both sides use it: the
// client connections (proxy/clientconn's listener wraps each) and the
// engine's (proxy/upstream dials through it). It also has the liveness
// peek the engine's connection pool checks an idle connection with.
package netclock

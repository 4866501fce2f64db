// Package clientconn is what the sidecar does with a client's connection
// beyond reading and writing HTTP: each is read through a receive-stamped
// netclock.Conn (a request's arrival is when its last bytes reached the
// machine) and written with the time it waited on the client counted;
// while a request is with the engine, the connection is watched for the
// client leaving, so the engine can be told at once; a write that waits
// on a client past --client-write-timeout fails; and after an error
// answered before the client finished sending, the connection closes
// lingering, so that the client reads the answer rather than a reset.
package clientconn

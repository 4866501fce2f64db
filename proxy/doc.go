// Package proxy is timing-sidecar's reverse proxy: a fasthttp server in
// front of an OpenAI-compatible engine that measures the requests of the
// APIs it knows, splices a metrics object into their responses, and
// passes everything else through untouched.
//
// It owns the request's way through: the handler (read the body within
// the memory budget, inspect it with the route's API, plan, edit,
// forward), the relays (a body as it comes, a body held for the splice,
// an event stream event by event with the finishing event's hold, an
// upgraded stream reassembled), the flight that carries a request's clock,
// plan and one result to telemetry, and the engine's readiness probe.
// What a request gets is decided in rewrite (rewrite.PlanFor,
// rewrite.FinishHold) and measured in timing; proxy carries it out. The
// mechanisms below it have packages of their own, each with its own
// tests, none importing proxy:
//   - proxy/upstream: the engine client, its connection pool, and the
//     exchange of one request;
//   - proxy/clientconn: the client's connection: disconnect watching,
//     the write timeout, lingering close;
//   - proxy/tlsserve: the TLS served to clients, re-read on rotation;
//   - proxy/netclock: the receive-stamped, stall-seeing connections both
//     sides read through;
//   - proxy/readahead: reading an engine's stream ahead of a stalled
//     client, each read with its receive stamp;
//   - proxy/membudget: the bound on the bytes held for bodies
//     (--max-body-memory);
//   - proxy/framing: the check that a message's body ends where every
//     parser reads it to.
package proxy

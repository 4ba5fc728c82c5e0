// Package lattice joins stagehost hosts into a lattice over NATS: each
// [Host] serves its deployment's sessions as NATS micro service endpoints
// (one queue group per session, so calls spread over the hosts that serve
// it) and publishes heartbeats to a JetStream KV bucket with a bucket TTL;
// a [Front] routes a session call to a free local instance or through the
// lattice, and knows from the heartbeats which live hosts serve which
// session. A host's resident sessions have a start and a status endpoint
// each, which [Front.StartResident] and [Front.ResidentStatus] reach
// (with an acknowledgement, as a call; a start sent once: it is not
// idempotent). [Claims] are exclusive
// placement keys won by KV
// compare-and-swap, and [Quarantine] is the lattice-wide list of poisoned
// module sha256s, checked against the module a session runs. A
// lattice-wide swap ([Front.SwapSession], [Member.SwapSession]) writes a
// session's desired module to a KV bucket (its bytes to an object store):
// every host applies it and acknowledges it in its heartbeat, and one
// that joins later applies it before it serves; [Host.Swap] swaps one
// host only.
//
// A call carries the W3C trace context in its NATS headers: with a
// TracerProvider ([FrontConfig], [HostConfig]) the front records a client
// span of it and the host a server span, the front's child; without one
// the caller's traceparent reaches the host unchanged.
//
// Each host stays authoritative for its own state: the KV buckets are a
// TTL'd cache of it, never a central reconciler's plan. docs/lattice.md
// lists the subjects, headers, buckets and keys.
package lattice

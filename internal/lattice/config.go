package lattice

import "time"

// Config is a lattice's settings, as [Join] takes them: the fields of a
// manifest's [lattice] table (docs/manifest.md, "[lattice]"), already
// validated and with its defaults filled in. The caller translates the
// table: its type has this one's fields, in this order, so
// lattice.Config(*m.Lattice) converts it, and a field added to one and
// not the other fails to compile there. This package does not import the
// manifest's (ARCHITECTURE.md), so it has no defaults of its own: a zero
// HeartbeatTTL or ClaimTTL is refused, a zero FenceFailures never
// quarantines lattice-wide.
type Config struct {
	Name   string // letters, digits, '-' or '_'
	HostID string // "" for the default ([HostID])
	// URL is the NATS server's URL, or a comma-separated list of them;
	// "" when Embedded.
	URL string
	// Embedded starts a NATS server (JetStream on) inside the process,
	// listening on Listen with its store in StoreDir ("" for a directory
	// under the user cache directory).
	Embedded         bool
	Listen, StoreDir string
	// TokenFile (its first line) or TokenEnv holds a NATS auth token;
	// NkeySeedFile an nkey seed. At most one of them. An embedded server
	// requires the same credentials of its clients.
	TokenFile, TokenEnv, NkeySeedFile string
	// TLSCA verifies the server; TLSCert and TLSKey (both or neither) are
	// the client's certificate, and an embedded server's.
	TLSCA, TLSCert, TLSKey string
	// HeartbeatTTL is the hosts' heartbeat TTL ([HostConfig.TTL]).
	HeartbeatTTL time.Duration
	// ClaimTTL is the placement claims' TTL ([HostConfig.ClaimTTL]).
	ClaimTTL time.Duration
	// FenceFailures is [HostConfig.FenceFailures]: 0 never.
	FenceFailures int
	// QuarantineOnDeviceLost puts a module in the shared quarantine when a
	// call to it made a device lost.
	QuarantineOnDeviceLost bool
	// Replicas is how many NATS servers keep each of the lattice's KV
	// buckets ([HostConfig.Replicas]).
	Replicas int
	// PayloadStoreMax bounds the payload store's bytes
	// ([HostConfig.PayloadStoreMax]).
	PayloadStoreMax int64
	// ClusterListen makes the embedded server a node of a NATS cluster
	// ([EmbeddedConfig.ClusterListen]); ClusterRoutes lists the nodes'
	// route URLs, comma-separated ([EmbeddedConfig.Routes]).
	ClusterListen, ClusterRoutes string
}

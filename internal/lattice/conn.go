package lattice

import "github.com/nats-io/nats.go"

// NATSConn is the member's connection to the lattice's NATS servers, for
// requests of its own on the lattice's subjects (a supervisor's model
// control of its workers, package modelctl). Do not close it: [Member.Close]
// does.
func (m *Member) NATSConn() *nats.Conn { return m.nc }

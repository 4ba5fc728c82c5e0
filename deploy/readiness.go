package deploy

// Readiness is whether a process should be sent traffic, and why not: the
// body of the HTTP service's /readyz and /v2/health/ready, and the
// readiness a lattice host's heartbeat carries.
type Readiness struct {
	Ready   bool     `json:"ready"`
	Status  string   `json:"status"`            // "ready", "starting", "draining" or "not_ready"
	Reasons []string `json:"reasons,omitempty"` // why not, one line each
	// Degraded lists, on a supervisor (serve --supervise), each worker
	// that is not ready and why, while another is (the service is ready).
	Degraded []string `json:"degraded,omitempty"`
}

package lattice

// SetLeaving marks h as leaving (or not) without stopping its endpoints:
// the moment between the start of Close and its endpoints stopping,
// which a test cannot otherwise hold open.
func SetLeaving(h *Host, on bool) {
	h.mu.Lock()
	h.closing = on
	h.mu.Unlock()
}

// AsServiceError is the error a [Member] gives the HTTP service for err
// (classError).
func AsServiceError(err error) error { return classError(err) }

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/tracing"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/service"
)

// startTracing builds the tracer provider of m's [tracing] table for a
// serve process (a no-op one without the table), with the process's host
// id and lattice name in its resource. On failure it returns the exit
// code (-1 on success): 3, a start-up failure, for a span file that
// cannot be opened.
func startTracing(m *manifest.Manifest, hostID, latticeName string, logger *slog.Logger, stderr io.Writer) (*tracing.Provider, int) {
	p, err := tracing.New((*tracing.Config)(m.Tracing), tracing.Options{HostID: hostID, Lattice: latticeName, Logger: logger})
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: %v\n", err)
		return nil, exitStartup
	}
	if p.Enabled() {
		logger.Info("tracing: recording spans", "to", p.String(), "host", hostID, "lattice", latticeName)
	}
	return p, -1
}

// stopTracing flushes the spans still queued (within
// tracing.ShutdownTimeout) and stops the exporter: serve calls it once
// the HTTP service has answered its accepted requests and the process
// has left its lattice.
func stopTracing(p *tracing.Provider, stderr io.Writer) {
	if err := p.Shutdown(context.Background()); err != nil {
		fmt.Fprintf(stderr, "stagehost serve: %v\n", err)
	}
}

// memberID is the host id Join gives a process in m's lattice: flag
// (serve's --host-id), else the table's host_id, else
// lattice.DefaultHostID; "" outside a lattice.
func memberID(m *manifest.Manifest, flag string) string {
	if m.Lattice == nil {
		return ""
	}
	return lattice.HostID(flag, service.LatticeConfig(*m.Lattice))
}

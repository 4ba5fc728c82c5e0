package service

import (
	"context"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/manifest"
)

// JoinLattice joins d to the lattice of m's [lattice] table (serve,
// docs/lattice.md) as host hostID and routes srv's run calls through it;
// tp records the host's and the front's spans. When ctx ends (SIGTERM),
// the host leaves at once: its endpoints stop and its heartbeat is
// deleted, then the calls it took through the lattice finish (up to
// grace). finish, called once the HTTP service has
// answered its own calls, waits for that and then closes the connection
// (and the embedded server).
func JoinLattice(ctx context.Context, m *manifest.Manifest, d *deploy.Deployment, srv *Server, hostID string, grace time.Duration, tp trace.TracerProvider, logger *slog.Logger) (*lattice.Member, func(), error) {
	member, err := lattice.Join(ctx, d, lattice.MemberConfig{Lattice: LatticeConfig(*m.Lattice), HostID: hostID, Readiness: srv.Readiness, Logger: logger, TracerProvider: tp})
	if err != nil {
		return nil, nil, err
	}
	srv.SetLattice(member)
	left := make(chan struct{})
	stopLeaving := make(chan struct{})
	go func() {
		defer close(left)
		select {
		case <-ctx.Done():
		case <-stopLeaving:
		}
		lctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		if err := member.Leave(lctx); err != nil {
			logger.Warn("lattice: leaving", "err", err)
		}
	}()
	finish := func() {
		close(stopLeaving)
		<-left
		member.Close()
	}
	return member, finish, nil
}

// LatticeConfig translates a manifest's [lattice] table into the
// lattice's own configuration (package internal/lattice does not read
// manifests): the same fields, defaults already filled in by the
// manifest's decoder.
func LatticeConfig(lt manifest.Lattice) lattice.Config { return lattice.Config(lt) }

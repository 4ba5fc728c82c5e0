package lattice

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedServer starts a nats-server inside the process, with JetStream
// on and its store in storeDir, listening on loopback only on a random
// port. Connect to it with nats.Connect(srv.ClientURL()); stop it with
// Shutdown (then WaitForShutdown).
//
// It is for tests, benchmarks and a single-machine lattice: a lattice of
// several machines runs its own nats-server (cluster).
func EmbeddedServer(storeDir string) (*server.Server, error) {
	if storeDir == "" {
		return nil, errors.New("lattice: EmbeddedServer needs a store directory")
	}
	opts := &server.Options{
		ServerName: "stagehost-embedded",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   storeDir,
		NoLog:      true,
		NoSigs:     true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("lattice: embedded nats-server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("lattice: embedded nats-server did not become ready within 10s")
	}
	return srv, nil
}

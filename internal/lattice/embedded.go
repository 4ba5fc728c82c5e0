package lattice

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
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
	return StartEmbedded(EmbeddedConfig{StoreDir: storeDir})
}

// EmbeddedConfig configures [StartEmbedded].
type EmbeddedConfig struct {
	// Listen is the host:port to listen on; "" for 127.0.0.1 on a random
	// port.
	Listen string
	// StoreDir is JetStream's store directory (required).
	StoreDir string
	// Token, when set, is the auth token every client must present.
	Token string
	// NkeyPublic, when set, is the public nkey every client must sign
	// with (the public key of the members' seed).
	NkeyPublic string
	// TLS, when set, makes the server speak TLS only.
	TLS *tls.Config
	// MaxPayload is the largest message the server takes, headers
	// included: it bounds a call's input and output through the lattice.
	// Default [DefaultMaxPayload].
	MaxPayload int32
	// ServerName names the server in its cluster (unique in it); ""
	// for "stagehost-embedded", or "stagehost-<ClusterListen>" with a
	// cluster.
	ServerName string
	// ClusterListen, when set, makes the server a node of a NATS
	// cluster: the host:port its routes listen on (port 0 for a random
	// one), with JetStream clustered (each of the lattice's buckets kept
	// on Replicas nodes). Routes lists the other nodes' route URLs
	// (nats-route://host:port); ClusterName names the cluster
	// ("stagehost" when ""). Every node of a cluster lists the same
	// routes (its own may be among them). A cluster of 3 nodes survives
	// the loss of any one: docs/lattice.md, "A NATS cluster".
	ClusterListen string
	Routes        []string
	ClusterName   string
}

// Liveness of the embedded server's clients: it pings a client that has
// sent nothing for EmbeddedPingInterval and closes its connection when
// EmbeddedMaxPingsOut pings are unanswered, so that the queue groups
// stop handing calls to a member that is stopped (SIGSTOP) or cut off
// within about 3 s instead of nats-server's 2 minutes (routes between
// the nodes of a cluster alike).
const (
	EmbeddedPingInterval = time.Second
	EmbeddedMaxPingsOut  = 2
)

// DefaultMaxPayload is an embedded server's max_payload: 8 MiB, the
// largest NATS recommends (its own default is 1 MiB).
const DefaultMaxPayload = 8 << 20

// StartEmbedded starts a nats-server inside the process, JetStream on,
// with cfg's listen address, store and client credentials.
func StartEmbedded(cfg EmbeddedConfig) (*server.Server, error) {
	if cfg.StoreDir == "" {
		return nil, errors.New("lattice: EmbeddedServer needs a store directory")
	}
	if cfg.Token != "" && cfg.NkeyPublic != "" {
		return nil, errors.New("lattice: an embedded server takes a token or an nkey, not both")
	}
	opts := &server.Options{
		ServerName:    "stagehost-embedded",
		Host:          "127.0.0.1",
		Port:          server.RANDOM_PORT,
		JetStream:     true,
		StoreDir:      cfg.StoreDir,
		NoLog:         true,
		NoSigs:        true,
		Authorization: cfg.Token,
		MaxPayload:    cfg.MaxPayload,
		PingInterval:  EmbeddedPingInterval,
		MaxPingsOut:   EmbeddedMaxPingsOut,
	}
	if cfg.ServerName != "" {
		opts.ServerName = cfg.ServerName
	}
	if cfg.ClusterListen != "" {
		if err := clusterOpts(opts, cfg); err != nil {
			return nil, err
		}
	}
	if opts.MaxPayload <= 0 {
		opts.MaxPayload = DefaultMaxPayload
	}
	if cfg.Listen != "" {
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("lattice: embedded server listen address %q: %w", cfg.Listen, err)
		}
		if opts.Port, err = strconv.Atoi(port); err != nil {
			return nil, fmt.Errorf("lattice: embedded server listen address %q: bad port", cfg.Listen)
		}
		if opts.Port == 0 {
			opts.Port = server.RANDOM_PORT
		}
		opts.Host = host
	}
	if cfg.NkeyPublic != "" {
		opts.Nkeys = []*server.NkeyUser{{Nkey: cfg.NkeyPublic}}
	}
	if cfg.TLS != nil {
		opts.TLSConfig = cfg.TLS
		opts.TLS = true
		opts.TLSTimeout = 2
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("lattice: embedded nats-server: %w", err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("lattice: embedded nats-server on %s did not become ready within 10s (is the port taken?)", net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)))
	}
	return srv, nil
}

// clusterOpts makes opts a node of the cluster cfg describes.
func clusterOpts(opts *server.Options, cfg EmbeddedConfig) error {
	host, port, err := net.SplitHostPort(cfg.ClusterListen)
	if err != nil {
		return fmt.Errorf("lattice: embedded server cluster listen address %q: %w", cfg.ClusterListen, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("lattice: embedded server cluster listen address %q: bad port", cfg.ClusterListen)
	}
	if p == 0 {
		p = server.RANDOM_PORT
	}
	name := cfg.ClusterName
	if name == "" {
		name = "stagehost"
	}
	if cfg.ServerName == "" {
		opts.ServerName = "stagehost-" + cfg.ClusterListen
	}
	opts.Cluster = server.ClusterOpts{Name: name, Host: host, Port: p,
		PingInterval: EmbeddedPingInterval, MaxPingsOut: EmbeddedMaxPingsOut}
	for _, r := range cfg.Routes {
		u, err := url.Parse(r)
		if err != nil || u.Host == "" || (u.Scheme != "nats-route" && u.Scheme != "nats") {
			return fmt.Errorf("lattice: embedded server route %q is not a nats-route://host:port URL", r)
		}
		opts.Routes = append(opts.Routes, u)
	}
	return nil
}

package lattice

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"go.opentelemetry.io/otel/trace"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/errdefs"
)

// MemberConfig configures [Join]: a manifest's [lattice] table and what
// the process adds to it.
type MemberConfig struct {
	Lattice Config
	// HostID overrides the table's host_id; with neither, [DefaultHostID].
	HostID string
	// Readiness is the HTTP service's (Server.Readiness), for the
	// heartbeat; nil for the host's own rule.
	Readiness func() deploy.Readiness
	Logger    *slog.Logger
	// TracerProvider records the host's and the front's spans
	// ([HostConfig.TracerProvider], [FrontConfig.TracerProvider]); nil
	// for none.
	TracerProvider trace.TracerProvider
}

// Member is a process's membership of a lattice, as `stagehost serve`
// runs it: the embedded NATS server if the manifest asks for one, the
// connection, a [Host] serving the process's deployment and a [Front]
// routing its HTTP calls. It implements service.Lattice.
type Member struct {
	name  string
	srv   *server.Server // nil unless embedded
	nc    *nats.Conn
	host  *Host
	front *Front
	log   *slog.Logger

	mu      sync.Mutex
	lastErr error // the connection's last error, for Ready
}

// HostID is the host id of a process in lattice lt: flag (serve's
// --host-id) if set, else lt's host_id, else [DefaultHostID].
func HostID(flag string, lt Config) string {
	switch {
	case flag != "":
		return flag
	case lt.HostID != "":
		return lt.HostID
	}
	return DefaultHostID()
}

// DefaultHostID is a host id from the hostname and the process id, with
// every character a host id may not hold replaced by '-'.
func DefaultHostID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "host"
	}
	h = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, h)
	return fmt.Sprintf("%s-%d", h, os.Getpid())
}

// Join joins d to the lattice cfg describes: it starts the embedded
// server (embedded = true), connects with the credentials, and starts
// the host and the front. With d nil the member is a front only (`serve
// --supervise`): it serves no session, has no heartbeat and no Host, and
// routes every call through the lattice. Leave, then Close, undo it.
func Join(ctx context.Context, d *deploy.Deployment, cfg MemberConfig) (*Member, error) {
	lt := cfg.Lattice
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	id := HostID(cfg.HostID, lt)
	m := &Member{name: lt.Name, log: cfg.Logger}
	ok := false
	defer func() {
		if !ok {
			m.Close()
		}
	}()
	opts := m.connOptions(id, lt.Name)
	emb := EmbeddedConfig{Listen: lt.Listen, ClusterListen: lt.ClusterListen, Routes: splitList(lt.ClusterRoutes)}
	if emb.ClusterListen != "" {
		emb.ServerName = "stagehost-" + id // unique in the cluster, as the host id is in the lattice
	}
	creds, err := credentials(lt, &emb)
	if err != nil {
		return nil, err
	}
	opts = append(opts, creds...)
	url := lt.URL
	if lt.Embedded {
		if url, err = m.startEmbedded(lt, emb); err != nil {
			return nil, err
		}
		if emb.ClusterListen != "" {
			// A request sent before the cluster's JetStream has a meta
			// leader may go unanswered: wait for one (the other nodes
			// are starting too).
			if err := waitJetStream(ctx, m.srv); err != nil {
				return nil, fmt.Errorf("lattice %s: the embedded node's JetStream cluster has no leader (are the other nodes of cluster_routes up?): %w", lt.Name, err)
			}
		}
	}
	if m.nc, err = nats.Connect(url, opts...); err != nil {
		return nil, fmt.Errorf("lattice %s: connecting to %s: %w", lt.Name, redactURLs(url), err)
	}
	if lt.Embedded && emb.ClusterListen != "" {
		// The cluster may drop JetStream requests while its nodes settle
		// (the other members make the same buckets at once): each bucket
		// is made with bounded attempts, again until one works.
		if err := settleCluster(ctx, m.nc, lt); err != nil {
			return nil, fmt.Errorf("lattice %s: the embedded node's JetStream cluster: %w", lt.Name, err)
		}
	}
	ff := lt.FenceFailures // 0: never
	if d != nil {
		if m.host, err = NewHost(ctx, m.nc, d, HostConfig{Lattice: lt.Name, ID: id, TTL: lt.HeartbeatTTL, ClaimTTL: lt.ClaimTTL, FenceFailures: ff, Replicas: lt.Replicas, PayloadStoreMax: lt.PayloadStoreMax,
			NoDeviceLostQuarantine: !lt.QuarantineOnDeviceLost, Readiness: cfg.Readiness, Logger: cfg.Logger, TracerProvider: cfg.TracerProvider}); err != nil {
			return nil, fmt.Errorf("lattice %s: %w", lt.Name, err)
		}
	}
	if m.front, err = NewFront(ctx, m.nc, FrontConfig{Lattice: lt.Name, TTL: lt.HeartbeatTTL, Replicas: lt.Replicas, PayloadStoreMax: lt.PayloadStoreMax, Local: m.host, Logger: cfg.Logger, TracerProvider: cfg.TracerProvider}); err != nil {
		return nil, fmt.Errorf("lattice %s: %w", lt.Name, err)
	}
	ok = true
	cfg.Logger.Info("lattice: joined", "lattice", lt.Name, "host", id, "url", m.nc.ConnectedUrlRedacted())
	return m, nil
}

// connOptions are the connection's options as host id: reconnect for
// ever ([ConnOptions]), and record (for Ready) and log disconnections and errors.
func (m *Member) connOptions(id, name string) []nats.Option {
	log := m.log
	// ConnOptions: failover over the servers of the URL list (failover.go).
	return append(ConnOptions(), nats.Name("stagehost "+id),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // Close: not a disconnection
			}
			m.setErr(err)
			log.Warn("lattice: disconnected from NATS", "lattice", name, "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			m.setErr(nil)
			log.Info("lattice: reconnected to NATS", "lattice", name, "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			log.Warn("lattice: NATS error", "lattice", name, "err", err)
		}))
}

// credentials reads lt's credentials (a token, an nkey seed) and TLS
// files: the connection's options, and in emb what an embedded server
// requires of its clients and serves with.
func credentials(lt Config, emb *EmbeddedConfig) ([]nats.Option, error) {
	var opts []nats.Option
	if lt.TokenFile != "" || lt.TokenEnv != "" {
		toks, err := deploy.ReadTokens(lt.TokenFile, lt.TokenEnv)
		if err != nil {
			return nil, fmt.Errorf("lattice %s: token: %w", lt.Name, err)
		}
		emb.Token = toks[0]
		opts = append(opts, nats.Token(toks[0]))
	}
	if lt.NkeySeedFile != "" {
		seed, err := deploy.ReadCredentialFile(lt.NkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("lattice %s: nkey seed: %w", lt.Name, err)
		}
		kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
		if err != nil {
			return nil, fmt.Errorf("lattice %s: nkey seed file %s: %w", lt.Name, lt.NkeySeedFile, err)
		}
		if emb.NkeyPublic, err = kp.PublicKey(); err != nil {
			return nil, fmt.Errorf("lattice %s: nkey seed file %s: %w", lt.Name, lt.NkeySeedFile, err)
		}
		opts = append(opts, nats.Nkey(emb.NkeyPublic, kp.Sign))
	}
	if lt.TLSCA != "" || lt.TLSCert != "" {
		tc, err := tlsConfig(lt, emb)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// tlsConfig is the client's TLS configuration of lt (tls_ca, tls_cert and
// tls_key); an embedded server serves with the same certificate (emb.TLS).
func tlsConfig(lt Config, emb *EmbeddedConfig) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if lt.TLSCA != "" {
		pem, err := deploy.ReadCredentialFile(lt.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("lattice %s: tls_ca: %w", lt.Name, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("lattice %s: tls_ca %s holds no PEM certificate", lt.Name, lt.TLSCA)
		}
	}
	if lt.TLSCert != "" {
		cert, err := loadKeyPair(lt.TLSCert, lt.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("lattice %s: TLS certificate %s and key %s: %w", lt.Name, lt.TLSCert, lt.TLSKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
		if lt.Embedded {
			emb.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		}
	}
	return tc, nil
}

// loadKeyPair reads a PEM certificate and key with
// deploy.ReadCredentialFile and parses them.
func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	cert, err := deploy.ReadCredentialFile(certFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := deploy.ReadCredentialFile(keyFile)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(cert, key)
}

// startEmbedded starts the embedded NATS server of lt (its store in
// store_dir, or under the user cache directory) and returns its client
// URL.
func (m *Member) startEmbedded(lt Config, emb EmbeddedConfig) (string, error) {
	emb.StoreDir = lt.StoreDir
	if emb.StoreDir == "" {
		dir, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("lattice %s: no store_dir and no user cache directory: %w", lt.Name, err)
		}
		emb.StoreDir = filepath.Join(dir, "stagehost", "nats", lt.Name)
	}
	var err error
	if m.srv, err = StartEmbedded(emb); err != nil {
		return "", fmt.Errorf("lattice %s: %w", lt.Name, err)
	}
	url := m.srv.ClientURL()
	m.log.Info("lattice: embedded NATS server started", "lattice", lt.Name, "url", url, "store_dir", emb.StoreDir)
	return url, nil
}

// waitJetStream waits until srv's JetStream is current with its
// cluster's meta leader, or ctx ends.
func waitJetStream(ctx context.Context, srv *server.Server) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !srv.JetStreamIsCurrent() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// settleCluster makes the lattice's buckets (each idempotent), each with
// attempts of 2 s until one succeeds or ctx ends.
func settleCluster(ctx context.Context, nc *nats.Conn, lt Config) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	steps := []func(context.Context) error{
		func(ctx context.Context) error {
			_, err := openHosts(ctx, js, lt.Name, lt.HeartbeatTTL, lt.Replicas)
			return err
		},
		func(ctx context.Context) error {
			q, err := OpenQuarantine(ctx, js, lt.Name, lt.Replicas)
			if err == nil {
				err = q.Close()
			}
			return err
		},
		func(ctx context.Context) error {
			_, err := OpenClaims(ctx, js, lt.Name, lt.ClaimTTL, lt.Replicas)
			return err
		},
		func(ctx context.Context) error { _, err := openCalls(ctx, js, lt.Name, lt.Replicas); return err },
		func(ctx context.Context) error {
			_, err := openPayloads(ctx, nc, js, lt.Name, lt.Replicas, lt.PayloadStoreMax)
			return err
		},
		func(ctx context.Context) error {
			m, err := openModels(ctx, js, lt.Name, lt.Replicas)
			if err == nil {
				err = m.close()
			}
			return err
		},
	}
	for _, step := range steps {
		for {
			actx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := step(actx)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil || !sleepCtx(ctx, 100*time.Millisecond) {
				return err
			}
		}
	}
	return nil
}

// splitList splits a comma-separated list, trimming white space and
// dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// redactURLs drops any user part of a URL list.
func redactURLs(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		if at := strings.LastIndex(p, "@"); at >= 0 {
			if sch := strings.Index(p, "://"); sch >= 0 && sch < at {
				parts[i] = p[:sch+3] + "redacted@" + p[at+1:]
			}
		}
	}
	return strings.Join(parts, ",")
}

func (m *Member) setErr(err error) {
	m.mu.Lock()
	m.lastErr = err
	m.mu.Unlock()
}

// Host is the member's host (nil for a front only); Front its front.
func (m *Member) Host() *Host   { return m.host }
func (m *Member) Front() *Front { return m.front }

// ClientURL is the embedded server's client URL ("" without one).
func (m *Member) ClientURL() string {
	if m.srv == nil {
		return ""
	}
	return m.srv.ClientURL()
}

// Call routes a call through the front, with ctx's trace context (the
// HTTP service's span, or the traceparent that came in). tp is the
// traceparent the call was sent to another host with, or ctx's when it
// was sent to none ("" without one). An error of another host or of the
// lattice is a [*errdefs.RemoteError]; a local session's errors are its
// own.
func (m *Member) Call(ctx context.Context, session string, input []byte) (out []byte, tp string, err error) {
	out, tp, err = m.front.call(ctx, session, input)
	if tp == "" { // sent to no host
		tp = Traceparent(ctx)
	}
	var le *Error
	if errors.As(err, &le) {
		return nil, tp, &errdefs.RemoteError{Class: le.Class, Message: le.Message, Host: le.Host, Code: le.Code}
	}
	return out, tp, err
}

// Known reports whether a heartbeat named the session since the member
// joined.
func (m *Member) Known(session string) bool { return m.front.Known(session) }

// StartResident starts a resident session's run through the front
// ([Front.StartResident]): on this process's host when it has the
// resident, else on a live host that has it, sent once. out is the
// host's [deploy.ResidentStart] as JSON. An error of another host or of
// the lattice is a [*errdefs.RemoteError]; a local resident's errors are
// its own.
func (m *Member) StartResident(ctx context.Context, resident string) ([]byte, error) {
	out, err := m.front.StartResident(ctx, resident)
	return out, classError(err)
}

// ResidentStatus is a resident session's [deploy.ResidentStatus] as
// JSON, through the front ([Front.ResidentStatus]); errors as
// StartResident's.
func (m *Member) ResidentStatus(ctx context.Context, resident string) ([]byte, error) {
	out, err := m.front.ResidentStatus(ctx, resident)
	return out, classError(err)
}

// KnownResident reports whether a heartbeat named the resident session
// since the member joined.
func (m *Member) KnownResident(resident string) bool { return m.front.KnownResident(resident) }

// classError is err as the HTTP service takes it: an [*Error] becomes a
// [*errdefs.RemoteError]; any other error, nil included, is unchanged.
func classError(err error) error {
	var le *Error
	if errors.As(err, &le) {
		return &errdefs.RemoteError{Class: le.Class, Message: le.Message, Host: le.Host, Code: le.Code}
	}
	return err
}

// Ready is nil while the connection to NATS is up.
func (m *Member) Ready() error {
	st := m.nc.Status()
	if st == nats.CONNECTED {
		return nil
	}
	m.mu.Lock()
	err := m.lastErr
	m.mu.Unlock()
	why := strings.ToLower(st.String())
	if err != nil {
		return fmt.Errorf("%s from the NATS server of lattice %s: %v", why, m.name, err)
	}
	return fmt.Errorf("%s from the NATS server of lattice %s", why, m.name)
}

// Hosts lists the live hosts' heartbeats.
func (m *Member) Hosts() []HostRecord { return m.front.Hosts() }

// Quarantined lists the shared quarantine.
func (m *Member) Quarantined() []Poison { return m.front.Quarantine().List() }

// Clear takes a module out of the shared quarantine, and waits (up to a
// second) until this process's view of it shows it (the front and the
// host share one view).
func (m *Member) Clear(ctx context.Context, sha256 string) (bool, error) {
	q := m.front.Quarantine()
	if _, ok := q.Lookup(sha256); !ok {
		return false, nil
	}
	if err := q.Clear(ctx, sha256); err != nil {
		return true, err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = q.WaitFor(wctx, func() bool { _, in := q.Lookup(sha256); return !in })
	return true, nil
}

// SwapSession swaps session to stage module ref ("name": its newest
// version loaded on this host; "name@SHA256"): on every host of the
// lattice ([Front.SwapSession], with the module's bytes from this host's
// deployment), or with hostOnly on this host only ([Host.Swap]). The
// answer is JSON-ready.
//
// # Errors
//
// unsupported for a member without a deployment (a supervisor's front);
// not_found for an unknown session or module; invalid_argument for a
// fence module or a module in the shared quarantine; and
// [Front.SwapSession]'s.
func (m *Member) SwapSession(ctx context.Context, session, ref string, hostOnly bool) (SwapAnswer, error) {
	ans, err := m.swapSession(ctx, session, ref, hostOnly)
	return ans, classError(err)
}

func (m *Member) swapSession(ctx context.Context, session, ref string, hostOnly bool) (SwapAnswer, error) {
	if m.host == nil {
		return SwapAnswer{Session: session}, errdefs.Errorf(errdefs.ErrUnsupported, "this process has no deployment: swap through a host of the lattice")
	}
	if hostOnly {
		res, err := m.host.Swap(ctx, session, ref)
		if err != nil {
			return SwapAnswer{Session: session, HostOnly: true}, err
		}
		_, sha, _ := strings.Cut(res.To, "@")
		return SwapAnswer{Session: session, To: res.To, SHA256: sha, HostOnly: true, Local: &res,
			Hosts: []SwapHost{{ID: m.host.ID(), Acknowledged: true, StageSHA256: sha}}}, nil
	}
	if m.host.sessions[session] == nil && !m.front.Known(session) {
		return SwapAnswer{Session: session}, errdefs.Errorf(errdefs.ErrNotFound, "no session %q in lattice %s", session, m.host.cfg.Lattice)
	}
	info, bin, err := m.host.d.ModuleBytes(ref)
	if err != nil {
		return SwapAnswer{Session: session}, err
	}
	if info.Kind != "stage" {
		return SwapAnswer{Session: session}, errdefs.Errorf(errdefs.ErrInvalidArgument, "module %s is a %s module, not a stage module", info.Ref, info.Kind)
	}
	if bin == nil {
		return SwapAnswer{Session: session}, errdefs.Errorf(errdefs.ErrUnsupported, "module %s: this host did not keep its bytes", info.Ref)
	}
	return m.front.SwapSession(ctx, DesiredModule{Session: session, Module: info.Name, SHA256: info.SHA256,
		MemoryLimit: info.MemoryLimit, WASI: info.WASI, Snapshot: info.Snapshot, By: m.host.ID()}, bin)
}

// Stats are the front's counts by route.
func (m *Member) Stats() map[string]uint64 {
	st := m.front.Stats()
	return map[string]uint64{"local": st.Local, "remote": st.Remote, "refused": st.Refused,
		"no_responders": st.NoResponders, "host_gone": st.HostGone, "unanswered": st.Unanswered}
}

// Leave stops the host: its endpoints stop and its heartbeat is deleted
// at once, then the calls it took through the lattice finish (or ctx
// ends). The front keeps routing this process's HTTP calls until Close.
// Disconnected, there is nothing to tell the lattice and no way to answer
// its calls: the connection closes first, so that leaving does not wait
// on requests that cannot be sent.
func (m *Member) Leave(ctx context.Context) error {
	if m.host == nil {
		return nil
	}
	m.closeIfDisconnected()
	return m.host.Close(ctx)
}

func (m *Member) closeIfDisconnected() {
	if m.nc != nil && m.nc.Status() != nats.CONNECTED {
		m.nc.Close()
	}
}

// Close stops the front, closes the connection (flushing what it has to
// send) and shuts the embedded server down. Call it after Leave and once
// the HTTP calls in flight are answered.
func (m *Member) Close() {
	m.closeIfDisconnected()
	if m.host != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = m.host.Close(ctx) // a no-op after Leave
		cancel()
	}
	if m.front != nil {
		m.front.Close()
	}
	if m.nc != nil && !m.nc.IsClosed() {
		_ = m.nc.FlushTimeout(time.Second)
		m.nc.Close()
	}
	if m.srv != nil {
		m.srv.Shutdown()
		m.srv.WaitForShutdown()
	}
}

package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/internal/lattice"
	"github.com/stagehost/stagehost/internal/modelctl"
	"github.com/stagehost/stagehost/internal/supervise"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/service"
	"github.com/stagehost/stagehost/stages"
)

// The environment `serve --supervise` gives its workers: the lattice's
// NATS URL (overriding the manifest's [lattice] url, and embedded) and,
// when the supervisor generated one, its token (overriding token_file,
// token_env and nkey_seed_file). Never on a command line.
const (
	envLatticeURL   = "STAGEHOST_LATTICE_URL"
	envLatticeToken = "STAGEHOST_LATTICE_TOKEN"
)

// supervisedLattice is the lattice name of `serve --supervise` on a
// manifest without a [lattice] table (its embedded server is private to
// the supervisor, so the name only has to agree between the two).
const supervisedLattice = "stagehost"

// workerLattice is the lattice a worker joins: the manifest's [lattice]
// (or the supervised defaults) with the supervisor's URL and token from
// the environment over it.
func workerLattice(m *manifest.Manifest) (manifest.Lattice, error) {
	lt := service.SupervisedLattice(supervisedLattice)
	if m.Lattice != nil {
		lt = *m.Lattice
	}
	if url := os.Getenv(envLatticeURL); url != "" {
		lt.URL, lt.Embedded = url, false
	}
	if os.Getenv(envLatticeToken) != "" {
		lt.TokenEnv, lt.TokenFile, lt.NkeySeedFile = envLatticeToken, "", ""
	}
	if lt.URL == "" || lt.Embedded {
		return lt, fmt.Errorf("a worker needs its supervisor's lattice: %s is not set (serve --worker is started by serve --supervise)", envLatticeURL)
	}
	return lt, nil
}

// serveWorker is `serve FILE --worker DEVICE [--tenant NAME]`: the
// supervisor's worker of one device and tenant ("" for the sessions
// without a tenant, and the residents). It opens that device's work of
// that tenant only (deploy.Config.WithDevice, WithTenant),
// joins the lattice as host id, reports ready to its supervisor, and
// exits, after reporting device_lost, when one of its devices is lost;
// on SIGTERM it leaves the lattice and exits 0.
func serveWorker(ctx context.Context, m *manifest.Manifest, device, tenant, hostID, stateDir string, grace time.Duration, quiet bool, logger *slog.Logger, stdout, stderr io.Writer) int {
	rep := supervise.WorkerReporter()
	// name is the worker's, as the supervisor's: it starts every line of
	// the worker's that says which worker it is, and its log lines carry
	// it (worker=NAME): a device's workers share its name otherwise.
	name := service.SupervisedWorkerName(device, tenant)
	logger = logger.With("worker", name)
	if m.Device(device) == nil {
		fmt.Fprintf(stderr, "stagehost serve: --worker %s: the manifest has no device %q\n", device, device)
		return exitUsage
	}
	if tenant != "" && !slices.Contains(m.SessionTenants(device), tenant) {
		fmt.Fprintf(stderr, "stagehost serve: --worker %s --tenant %s: no session of tenant %q is on device %q\n", device, tenant, tenant, device)
		return exitUsage
	}
	lt, err := workerLattice(m)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: --worker %s: %v\n", device, err)
		return exitUsage
	}
	hostID = lattice.HostID(hostID, service.LatticeConfig(lt))
	tp, code := startTracing(m, hostID, lt.Name, logger, stderr)
	if code >= 0 {
		return code
	}
	defer stopTracing(tp, stderr) // after the worker left the lattice
	opt := deploy.NewConfig().WithLogger(logger).WithDevice(device).WithTenant(tenant)
	if tenant != "" {
		opt = opt.WithOverdue(m.TenantPolicy(tenant).HangGrace, func(o deploy.Overdue) { endHung(rep, tenant, o, logger) })
	}
	if !quiet {
		opt = opt.WithProgress(func(msg string) { fmt.Fprintf(stderr, "worker %s: %s\n", name, msg) })
	}
	d, err := deploy.Open(ctx, m, opt)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: worker %s cannot start: %v\n", name, err)
		_ = rep.Exiting("cannot start: " + err.Error())
		return exitStartup
	}
	// lost names a device of the worker's that is lost, and why.
	lost := func() (string, error) {
		for _, dev := range d.DeviceNames() {
			if err := d.DeviceErr(dev); err != nil {
				return dev, err
			}
		}
		return "", nil
	}
	closeDeployment := func() {
		cctx, cancel := context.WithTimeout(context.Background(), grace)
		defer cancel()
		if err := d.Close(cctx); err != nil {
			logger.Warn("worker: closing the deployment", "device", device, "err", err)
		}
	}
	if dev, err := lost(); err != nil { // lost already: never joins, so never offers its sessions
		logger.Error("worker: device lost at start; exiting to be restarted", "device", dev, "err", err)
		_ = rep.DeviceLost(dev, err.Error())
		closeDeployment()
		reason := fmt.Sprintf("device %s lost: %v", dev, err)
		_ = rep.Exiting(reason)
		fmt.Fprintf(stdout, "worker %s stopped: %s\n", name, reason)
		return exitFailed
	}
	// The model state (modules uploaded, swaps) is applied before the
	// worker joins: its first call runs what the supervisor recorded.
	var store modelctl.Store
	var restored modelctl.Restored
	if stateDir != "" {
		store = modelctl.OpenDir(stateDir)
		restored = modelctl.Restore(ctx, d, store, logger)
		for _, line := range restored.Applied {
			fmt.Fprintf(stdout, "worker %s: %s\n", name, line)
		}
		for _, line := range restored.Notes {
			fmt.Fprintf(stdout, "worker %s: model state: %s\n", name, line)
		}
	}
	member, err := lattice.Join(ctx, d, lattice.MemberConfig{Lattice: service.LatticeConfig(lt), HostID: hostID, Logger: logger, TracerProvider: tp.TracerProvider()})
	if err != nil {
		closeDeployment()
		fmt.Fprintf(stderr, "stagehost serve: worker %s: %v\n", name, err)
		_ = rep.Exiting("cannot join the lattice: " + err.Error())
		return exitStartup
	}
	var modelSub interface{ Unsubscribe() error }
	if store != nil {
		sub, err := modelctl.Serve(member.NATSConn(), lt.Name, member.Host().ID(), d, store, logger)
		if err != nil {
			member.Close()
			closeDeployment()
			fmt.Fprintf(stderr, "stagehost serve: worker %s: model control: %v\n", name, err)
			_ = rep.Exiting("cannot serve model control: " + err.Error())
			return exitStartup
		}
		modelSub = sub
	}
	stopLocal, err := serveLocal(member.Host(), m, logger)
	if err != nil {
		if modelSub != nil {
			_ = modelSub.Unsubscribe()
		}
		member.Close()
		closeDeployment()
		fmt.Fprintf(stderr, "stagehost serve: worker %s: local transport: %v\n", name, err)
		_ = rep.Exiting("cannot serve the local transport: " + err.Error())
		return exitStartup
	}
	fmt.Fprintf(stdout, "worker %s joined lattice %s as host %s (%s, %s)\n", name, lt.Name, member.Host().ID(),
		plural(len(d.SessionNames()), "session"), plural(len(d.ResidentNames()), "resident session"))
	if err := rep.ReadyServing(supervise.Serving{Devices: d.DeviceNames(), Sessions: d.SessionNames(), Notes: restored.Notes, StateRevision: restored.Revision}); err != nil {
		logger.Warn("worker: reporting ready", "err", err)
	}
	reason, code := "SIGTERM", exitOK
	tick := time.NewTicker(50 * time.Millisecond)
watch:
	for {
		select {
		case <-ctx.Done():
			break watch
		case <-tick.C:
			if tenant != "" {
				if why := quarantinedInstance(d); why != "" {
					// The device work of a call cannot be proven
					// finished: only the end of this process stops it.
					// No graceful close: closing could wait on it.
					reason := fmt.Sprintf("tenant %s: %s; ending the worker", tenant, why)
					logger.Error("worker: a call's device work did not finish; exiting to be restarted", "tenant", tenant, "why", why)
					_ = rep.DeviceLost(device, reason)
					_ = rep.Exiting(reason)
					fmt.Fprintf(stdout, "worker %s stopped: %s\n", name, reason)
					hardExit(exitFailed)
				}
			}
			if dev, err := lost(); err != nil {
				reason, code = fmt.Sprintf("device %s lost: %v", dev, err), exitFailed
				logger.Error("worker: device lost; exiting to be restarted", "device", dev, "err", err)
				if err := rep.DeviceLost(dev, err.Error()); err != nil {
					logger.Warn("worker: reporting device_lost", "err", err)
				}
				break watch
			}
		}
	}
	tick.Stop()
	stopLocal()
	if modelSub != nil {
		_ = modelSub.Unsubscribe()
	}
	lctx, cancel := context.WithTimeout(context.Background(), grace)
	if err := member.Leave(lctx); err != nil {
		logger.Warn("worker: leaving the lattice", "err", err)
	}
	cancel()
	member.Close()
	closeDeployment()
	_ = rep.Exiting(reason)
	fmt.Fprintf(stdout, "worker %s stopped: %s\n", name, reason)
	return code
}

// hardExit ends a worker at once (os.Exit): no deferred call runs.
var hardExit = os.Exit

// hungOnce makes endHung act once per process.
var hungOnce sync.Once

// endHung ends a tenant's worker whose call o is still running its
// tenant's hang_grace past its deadline: its stage was interrupted at the
// deadline, so device work of the tenant's (a kernel) is what has not
// finished, and nothing inside the process can stop it (docs/security.md).
// The worker reports hung; its supervisor sends SIGKILL at once and
// restarts it. Unsupervised, or should no SIGKILL come within a second,
// it exits by itself, with no graceful close (closing would wait on the
// hung work).
func endHung(rep *supervise.Reporter, tenant string, o deploy.Overdue, logger *slog.Logger) {
	hungOnce.Do(func() {
		reason := fmt.Sprintf("tenant %s: session %s instance %d: a call's device work still ran %s after its deadline (hang_grace)", tenant, o.Session, o.Instance, o.Grace)
		logger.Error("worker: a call's device work outlived its deadline; asking to be killed", "tenant", tenant, "session", o.Session, "instance", o.Instance, "device", o.Device, "grace", o.Grace)
		// Armed first: a report that cannot be written (the
		// supervisor's end of the pipe full) must not keep the worker.
		time.AfterFunc(time.Second, func() { hardExit(exitFailed) })
		if err := rep.Hung(o.Device, reason); err != nil || !rep.Supervised() {
			hardExit(exitFailed)
		}
	})
}

// supervisorFlags are the serve flags a supervisor passes on to its
// workers.
type supervisorFlags struct {
	hostID, level string
	// stateDir is --state-dir: "" for the default, "off" for none kept
	// past the supervisor's exit.
	stateDir string
	grace    time.Duration
	quiet    bool
}

// serveSupervisor is `serve FILE --supervise`: it opens no device, starts
// a worker process (serve --worker) per device of the manifest, joins the
// lattice as a front only (the manifest's [lattice], or an embedded NATS
// server on loopback with a token it generates), and serves the HTTP API
// with every call routed through the lattice and the workers' state in
// /v1/workers, /v1/sessions, /readyz and /metrics. On SIGTERM it drains
// the HTTP service, stops the workers (SIGTERM, then SIGKILL after the
// stop timeout), closes the lattice and exits 0.
func serveSupervisor(ctx context.Context, stop func(), m *manifest.Manifest, path, addr string, cfg service.Config, fl supervisorFlags, logger *slog.Logger, stdout, stderr io.Writer) int {
	if len(m.Devices) == 0 {
		fmt.Fprintln(stderr, "stagehost serve: --supervise: the manifest has no [[device]] to start a worker for")
		return exitUsage
	}
	// The workers join a lattice: their sessions' and residents' names
	// become NATS subject tokens (a manifest with [lattice] has them
	// checked when it is read).
	if bad := service.SupervisedNameErrors(m); len(bad) > 0 {
		fmt.Fprintf(stderr, "stagehost serve: --supervise: %s: under a supervisor a session or resident name is letters, digits, '-' and '_' (one NATS subject token)\n", strings.Join(bad, ", "))
		return exitUsage
	}
	// Each worker's name is its socket's, its host id's and its entry in
	// /v1/workers: a tenant worker may not be named like another worker.
	if bad := service.SupervisedWorkerNameErrors(m); len(bad) > 0 {
		fmt.Fprintf(stderr, "stagehost serve: --supervise: %s: rename the device or the tenant\n", strings.Join(bad, "; "))
		return exitUsage
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: --supervise: %v\n", err)
		return exitStartup
	}
	manifestPath, err := filepath.Abs(path)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: --supervise: %v\n", err)
		return exitStartup
	}
	// The lattice: the manifest's, or a private embedded server.
	var lt manifest.Lattice
	var workerEnv []string
	if m.Lattice != nil {
		lt = *m.Lattice
	} else {
		dir, err := os.MkdirTemp("", "stagehost-supervise-*")
		if err != nil {
			fmt.Fprintf(stderr, "stagehost serve: --supervise: %v\n", err)
			return exitStartup
		}
		defer os.RemoveAll(dir)
		var b [32]byte
		_, _ = rand.Read(b[:])
		token := hex.EncodeToString(b[:])
		// Join reads the token from the environment; the workers inherit
		// it from there (and get it in Worker.Env too).
		if err := os.Setenv(envLatticeToken, token); err != nil {
			fmt.Fprintf(stderr, "stagehost serve: --supervise: %v\n", err)
			return exitStartup
		}
		lt = service.SupervisedLattice(supervisedLattice)
		lt.Embedded, lt.Listen, lt.StoreDir, lt.TokenEnv = true, "127.0.0.1:0", filepath.Join(dir, "nats"), envLatticeToken
		workerEnv = append(workerEnv, envLatticeToken+"="+token)
	}
	stateDir, keep, err := resolveStateDir(fl.stateDir, manifestPath)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: --state-dir: %v\n", err)
		return exitStartup
	}
	if !keep {
		defer os.RemoveAll(stateDir)
	}
	baseID := lattice.HostID(fl.hostID, service.LatticeConfig(lt))
	tp, code := startTracing(m, baseID, lt.Name, logger, stderr)
	if code >= 0 {
		return code
	}
	defer stopTracing(tp, stderr) // after the service drained and the workers stopped
	cfg.TracerProvider = tp.TracerProvider()

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: %v\n", err)
		return exitStartup
	}
	srv := service.NewStartingServer(logger, cfg)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln, fl.grace) }()
	fail := func(format string, args ...any) int {
		stop()
		<-served
		fmt.Fprintf(stderr, "stagehost serve: "+format+"\n", args...)
		return exitStartup
	}
	// The supervisor's deployment has no device, session nor resident:
	// the service routes every call through the lattice.
	front := *m
	front.Devices, front.Modules, front.Sessions, front.Residents = nil, nil, nil, nil
	d, err := deploy.Open(ctx, &front, deploy.NewConfig().WithLogger(logger))
	if err != nil {
		return fail("%v", err)
	}
	defer d.Close(context.Background())
	srv.Attach(d)
	member, err := lattice.Join(ctx, nil, lattice.MemberConfig{Lattice: service.LatticeConfig(lt), HostID: baseID, Logger: logger, TracerProvider: tp.TracerProvider()})
	if err != nil {
		return fail("%v", err)
	}
	if url := member.ClientURL(); url != "" {
		workerEnv = append(workerEnv, envLatticeURL+"="+url)
	}
	// The local transport: a socket per worker in a directory of
	// this process's (mode 0700, sockets 0600).
	sockDir, err := os.MkdirTemp("", "stagehost-sock-*")
	if err != nil {
		member.Close()
		return fail("--supervise: %v", err)
	}
	defer os.RemoveAll(sockDir)
	srvWorkers, err := supervisedWorkers(m, self, manifestPath, baseID, stateDir, fl, workerEnv)
	if err != nil {
		member.Close()
		return fail("--supervise: %v", err)
	}
	sockets, hosts := map[string]string{}, map[string]string{}
	for i := range srvWorkers {
		w := &srvWorkers[i]
		sockets[w.Name], hosts[w.Name] = filepath.Join(sockDir, w.Name+".sock"), baseID+"-"+w.Name
		w.Env = append(slices.Clone(w.Env), envLocalSocket+"="+sockets[w.Name])
	}
	routes := newLocalRoutes(member.Front(), sockets, hosts, m, logger)
	defer routes.close()
	srv.SetLattice(service.SupervisorFrontLocal(member, m, routes.route))

	workers := srvWorkers
	names := make([]string, 0, len(workers))
	for _, w := range workers {
		names = append(names, w.Name)
	}
	// The model control's hook on the workers' changes, set once it
	// exists (before the routes can change the model state).
	var onChange atomic.Pointer[func(supervise.WorkerStatus)]
	guard := newTenantGuard(m, time.Now, func(tenant, reason string) {
		logger.Error("tenant quarantined lattice-wide", "tenant", tenant, "reason", reason)
		fmt.Fprintf(stdout, "tenant %s quarantined lattice-wide: %s\n", tenant, reason)
		go func() {
			pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := member.Front().Quarantine().Poison(pctx, lattice.Poison{SHA256: lattice.TenantKey(tenant), Reason: reason, Host: baseID}); err != nil {
				logger.Warn("quarantining a tenant", "tenant", tenant, "err", err)
			}
		}()
	})
	guard.quarantined = func(tenant string) bool {
		_, ok := member.Front().Quarantine().Lookup(lattice.TenantKey(tenant))
		return ok
	}
	sup, err := supervise.Start(supervise.NewConfig().WithWorkers(workers...).WithLogger(logger).WithOnChange(func(st supervise.WorkerStatus) {
		guard.changed(st)
		if fn := onChange.Load(); fn != nil {
			(*fn)(st)
		}
	}))
	if err != nil {
		member.Close()
		return fail("--supervise: %v", err)
	}
	routes.sup.Store(sup)
	srv.SetWorkers(service.SupervisorWorkers(sup, member.Front(), m))
	mc, changed := service.SupervisorModelControl(service.SupervisorModel{Conn: member.NATSConn(), Lattice: lt.Name,
		Supervisor: sup, HostOf: func(w string) string { return baseID + "-" + w }, Store: modelctl.OpenDir(stateDir), Manifest: m, Logger: logger})
	onChange.Store(&changed)
	for _, st := range sup.Status() { // those ready already
		changed(st)
	}
	srv.SetModelControl(mc)
	fmt.Fprintf(stdout, "supervising %s (%s) in lattice %s as front %s\n", plural(len(workers), "worker"), strings.Join(names, ", "), lt.Name, baseID)
	if keep {
		fmt.Fprintf(stdout, "model state (uploaded modules, swaps) kept in %s\n", stateDir)
	}
	scheme := "http"
	if cfg.TLSCert != "" {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "serving %s on %s://%s (%s over %s, through the lattice)\n",
		path, scheme, ln.Addr(), plural(len(m.Sessions), "session"), plural(len(workers), "worker"))
	err = <-served
	// Accepted requests are answered: now the workers stop (they leave
	// the lattice), then the front and the NATS server.
	sctx, cancel := context.WithTimeout(context.Background(), supervise.DefaultStopTimeout+5*time.Second)
	if serr := sup.Stop(sctx); serr != nil {
		logger.Warn("stopping the workers", "err", serr)
	}
	cancel()
	member.Close()
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: %v\n", err)
		return exitFailed
	}
	fmt.Fprintln(stdout, stoppedLine(srv))
	return exitOK
}

// supervisedWorkers are the workers of `serve --supervise`: per device,
// its shared worker (named after the device: the sessions without a
// tenant, and the residents), and a worker per tenant with a session on
// it (named DEVICE-TENANT, started with --tenant TENANT): a failure
// domain per (device, tenant), docs/security.md.
//
// # Errors
//
// A worker's name that is also another's (service.SupervisedWorkerNameErrors).
func supervisedWorkers(m *manifest.Manifest, self, manifestPath, baseID, stateDir string, fl supervisorFlags, env []string) ([]supervise.Worker, error) {
	var workers []supervise.Worker
	if bad := service.SupervisedWorkerNameErrors(m); len(bad) > 0 {
		return nil, fmt.Errorf("%s: rename the device or the tenant", strings.Join(bad, "; "))
	}
	add := func(device, tenant string) {
		name := service.SupervisedWorkerName(device, tenant)
		args := []string{"serve", manifestPath, "--worker", device, "--host-id", baseID + "-" + name,
			"--log-level", fl.level, "--grace", fl.grace.String(), "--state-dir", stateDir}
		if tenant != "" {
			args = append(args, "--tenant", tenant)
		}
		if fl.quiet {
			args = append(args, "--quiet")
		}
		workers = append(workers, supervise.Worker{Name: name, Tenant: tenant, Path: self, Args: args, Env: env})
	}
	for _, md := range m.Devices {
		add(md.Name, "")
		for _, t := range m.SessionTenants(md.Name) {
			add(md.Name, t)
		}
	}
	return workers, nil
}

// stateDirOff is the --state-dir value that keeps no model state past the
// supervisor's exit.
const stateDirOff = "off"

// resolveStateDir is serve --supervise's model-state directory: flag
// (--state-dir) if set, else DefaultStateDir of the manifest. With "off"
// it is a temporary directory, removed at exit (keep false): the workers
// still load uploads from it, and restore them when one of them
// restarts, but a restart of the supervisor starts from the manifest.
func resolveStateDir(flag, manifestPath string) (dir string, keep bool, err error) {
	switch flag {
	case stateDirOff:
		dir, err := os.MkdirTemp("", "stagehost-state-*")
		return dir, false, err
	case "":
		return defaultStateDir(manifestPath), true, nil
	}
	dir, err = filepath.Abs(flag)
	return dir, true, err
}

// defaultStateDir is USER_CACHE_DIR/stagehost/state/KEY, beside the
// compilation cache (stages.DefaultCacheDir), KEY the first 16 hex digits
// of the sha256 of the manifest's absolute path: a manifest edited in
// place keeps its state.
func defaultStateDir(manifestPath string) string {
	sum := sha256.Sum256([]byte(manifestPath))
	return filepath.Join(filepath.Dir(stages.DefaultCacheDir()), "state", hex.EncodeToString(sum[:8]))
}

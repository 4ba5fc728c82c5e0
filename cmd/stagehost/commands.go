package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/stagehost/stagehost/abi"
	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/internal/modelctl"
	"github.com/stagehost/stagehost/internal/tracing"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/service"
)

// command is one subcommand's flags and usage.
type command struct {
	fs       *flag.FlagSet
	synopsis string // after "stagehost NAME"
	about    string
	nargs    int // positional arguments: 1 (FILE) or 0
	// weightsAtUpload, when set, tells parseManifest (after the flags are
	// parsed) whether the deployment about to open hashes the weights as
	// it uploads them, so that loading the manifest need not hash them
	// too (manifest.LoadConfig.WithWeightsHashAtUpload).
	weightsAtUpload func() bool
}

func newCommand(name, synopsis, about string) *command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {} // parse prints the usage itself, to stdout for --help
	return &command{fs: fs, synopsis: synopsis, about: about, nargs: 1}
}

// printUsage writes the command's usage, its flags spelt --flag.
func (c *command) printUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s\n\n%s\n\nFlags:\n", strings.TrimSpace("stagehost "+c.fs.Name()+" "+c.synopsis), c.about)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	c.fs.VisitAll(func(f *flag.Flag) {
		name, help := flag.UnquoteUsage(f)
		arg := "--" + f.Name
		if name != "" {
			arg += " " + name
		}
		if f.DefValue != "" && f.DefValue != "false" {
			help += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(tw, "  %s\t%s\n", arg, help)
	})
	fmt.Fprintf(tw, "  --help, -h\tprint this and exit\n")
	tw.Flush()
}

// parse parses flags that may come before or after the positional
// argument (the manifest or trace file). On failure it returns the exit
// code: exitOK for --help (the usage goes to stdout), exitUsage otherwise
// (the problem and the usage go to stderr).
func (c *command) parse(args []string, stdout, stderr io.Writer) (string, int) {
	fs := c.fs
	fs.SetOutput(stderr)
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.printUsage(stdout)
				return "", exitOK
			}
			fmt.Fprintln(stderr)
			c.printUsage(stderr)
			return "", exitUsage
		}
		args = fs.Args()
		if len(args) > 0 {
			pos = append(pos, args[0])
			args = args[1:]
		}
	}
	if len(pos) != c.nargs {
		if c.nargs == 0 {
			fmt.Fprintf(stderr, "stagehost %s: takes no arguments, got %d\n\n", fs.Name(), len(pos))
		} else {
			fmt.Fprintf(stderr, "stagehost %s: want exactly one FILE argument, got %d\n\n", fs.Name(), len(pos))
		}
		c.printUsage(stderr)
		return "", exitUsage
	}
	if c.nargs == 0 {
		return "", -1
	}
	return pos[0], -1
}

// plural returns "1 device" or "n devices": n and noun, with s added
// unless n is 1. A noun whose plural is not noun+"s" gives it after a
// "|": plural(n, "lane occupancy|lane occupancies").
func plural(n int, noun string) string {
	one, many, ok := strings.Cut(noun, "|")
	if !ok {
		many = one + "s"
	}
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}

// parseManifest parses the flags and the one FILE argument, and loads that
// manifest; it reports every problem on stderr. On failure it returns the
// exit code (-1 on success).
func parseManifest(c *command, args []string, stdout, stderr io.Writer) (*manifest.Manifest, string, int) {
	path, code := c.parse(args, stdout, stderr)
	if code >= 0 {
		return nil, "", code
	}
	cfg := manifest.NewLoadConfig()
	if c.weightsAtUpload != nil {
		cfg = cfg.WithWeightsHashAtUpload(c.weightsAtUpload())
	}
	m, err := manifest.LoadWith(path, cfg)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, "", exitInvalid
	}
	return m, path, -1
}

const checkAbout = `Validate a manifest and every module it names; nothing is compiled or run.
A module whose sha256 is missing, empty, malformed or stale is reported
with the file's actual hash.

With --print-sha256, print instead one line per module with the sha256
its file has now, a TOML line to paste over the module's sha256 after
checking that the file is the one meant:

  sha256 = "HASH" # module[0] NAME: PATH (line N: matches, differs, empty or missing, malformed)

and exit 0 whatever the manifest declares (65 when a module's file cannot
be read; the manifest's errors are then printed). The manifest itself is
not changed: it still pins every module, and run and serve still refuse
one whose hash is not the file's.`

// printModuleHashes is check --print-sha256.
func printModuleHashes(path string, stdout, stderr io.Writer) int {
	hashes, err := manifest.ModuleHashes(path)
	for _, h := range hashes {
		state := "differs"
		switch {
		case h.Matches():
			state = "matches"
		case h.Declared == "":
			state = "empty or missing"
		case len(h.Declared) != len(h.SHA256):
			state = "malformed"
		}
		fmt.Fprintf(stdout, "sha256 = %q # %s %s: %s (line %d: %s)\n", h.SHA256, strings.TrimSuffix(h.Key, ".sha256"), h.Name, h.Path, h.Line, state)
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	return exitOK
}

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	c := newCommand("check", "FILE", checkAbout)
	printSHA := c.fs.Bool("print-sha256", false, "print each module's actual sha256 as a TOML line, whatever the manifest declares, and exit 0 (see above)")
	path, code := c.parse(args, stdout, stderr)
	if code >= 0 {
		return code
	}
	if *printSHA {
		return printModuleHashes(path, stdout, stderr)
	}
	m, err := manifest.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	if code >= 0 {
		return code
	}
	fmt.Fprintf(stdout, "%s: ok: %s, %s, %s, %s\n", path, plural(len(m.Devices), "device"),
		plural(len(m.Modules), "module"), plural(len(m.Sessions), "session"), plural(len(m.Residents), "resident session"))
	for _, mod := range m.Modules {
		fmt.Fprintf(stdout, "  module %-12s %-5s %8d bytes  sha256 %s…  ABI v%d ok\n", mod.Name, mod.Kind, len(mod.Bytes), mod.SHA256[:12], abi.Version)
		if r := mod.Requires; r != nil {
			fmt.Fprintf(stdout, "    requires %s\n", requiresSummary(r))
		}
	}
	for _, w := range m.Weights {
		fmt.Fprintf(stdout, "  weights %-11s %-5s %8d bytes  sha256 %s…  %s\n", w.Name, w.Format, w.DataSize, w.SHA256[:12], plural(len(w.Tensors), "tensor"))
	}
	for _, k := range m.Kernels {
		fmt.Fprintf(stdout, "  kernel %-12s %s\n", k.Name, vendorKernelSummary(&k))
	}
	if !checkVendorPTX(m, stdout, stderr) {
		return exitInvalid
	}
	if tr := m.Tracing; tr != nil {
		to := tr.Endpoint + tracing.OTLPPath
		if tr.Exporter == manifest.TracingFile {
			to = tr.File
		}
		fmt.Fprintf(stdout, "  tracing %s to %s, sample_ratio %g, service.name %s\n", tr.Exporter, to, tr.SampleRatio, tr.ServiceName)
	}
	// Without [lattice] such names are fine, except under a supervisor
	// (its workers join a lattice of its own): say so, without failing.
	for _, name := range service.SupervisedNameErrors(m) {
		fmt.Fprintf(stdout, "  note: %s is not a NATS subject token (letters, digits, '-', '_'): serve --supervise refuses it; a plain serve runs it\n", name)
	}
	for _, why := range service.SupervisedWorkerNameErrors(m) {
		fmt.Fprintf(stdout, "  note: %s: serve --supervise refuses it; a plain serve runs it\n", why)
	}
	return exitOK
}

// requiresSummary is one line of a module's declared requirements, as
// check prints them: "programs matmul, softmax; inputs pixels FP32 [-1 784]; …".
func requiresSummary(r *abi.Requires) string {
	var parts []string
	list := func(key string, names []string) {
		if len(names) > 0 {
			parts = append(parts, key+" "+strings.Join(names, ", "))
		}
	}
	list("programs", r.Programs)
	list("streams", r.Streams)
	list("weights", r.Weights)
	list("wasi", r.WASI)
	if r.MinBudgetBytes > 0 {
		parts = append(parts, "min_budget "+manifest.FormatSize(r.MinBudgetBytes))
	}
	if r.ABIRevision > 0 {
		parts = append(parts, fmt.Sprintf("ABI revision %d", r.ABIRevision))
	}
	tensors := func(key string, ts []abi.TensorSpec) {
		var s []string
		for _, t := range ts {
			s = append(s, fmt.Sprintf("%s %s %v", t.Name, t.Datatype, t.Shape))
		}
		list(key, s)
	}
	tensors("inputs", r.Inputs)
	tensors("outputs", r.Outputs)
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, "; ")
}

// logLevel is the --log-level flag: debug, info, warn (the default) or
// error.
type logLevel struct{ slog.Level }

func (l *logLevel) String() string { return strings.ToLower(l.Level.String()) }
func (l *logLevel) Set(s string) error {
	switch s {
	case "debug", "info", "warn", "error":
		return l.Level.UnmarshalText([]byte(s))
	}
	return fmt.Errorf("want debug, info, warn or error")
}

// logLevelFlag adds --log-level to fs.
func logLevelFlag(fs *flag.FlagSet) *logLevel {
	l := &logLevel{slog.LevelWarn}
	fs.Var(l, "log-level", "log `level` on stderr: debug, info (guest logs, serve's access log), warn or error")
	return l
}

// newLogger logs on stderr from level up; a record logged while serving
// a request (a guest's log included) carries the request's request_id.
func newLogger(stderr io.Writer, level slog.Level) *slog.Logger {
	return slog.New(service.RequestIDHandler(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})))
}

// open opens the deployment; with only set, just that session or
// resident session and the modules it needs (deploy.Config.WithOnly).
// Progress (module loading) goes to stderr unless quiet; warnings and
// errors always do.
func open(ctx context.Context, m *manifest.Manifest, only string, quiet bool, logger *slog.Logger, stderr io.Writer) (*deploy.Deployment, int) {
	opt := deploy.NewConfig().WithLogger(logger).WithOnly(only)
	if !quiet {
		opt = opt.WithProgress(func(msg string) { fmt.Fprintln(stderr, msg) })
	}
	d, err := deploy.Open(ctx, m, opt)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost: cannot start: %v\n", err)
		return nil, exitStartup
	}
	return d, exitOK
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	c := newCommand("run", "FILE [flags]", "Run every session (with its manifest input) and every resident session once, print\ntheir results and a lane summary.")
	fs := c.fs
	only := fs.String("session", "", "run only the session or resident session `NAME`, loading only the modules it needs")
	inputFile := fs.String("input", "", "the session's input `FILE` (needs --session naming a session; default: its manifest input)")
	traceFile := fs.String("trace", "", "write a Chrome/Perfetto trace to `out.json`")
	quiet := fs.Bool("quiet", false, "print no progress (module loading) on stderr; results and errors still show")
	level := logLevelFlag(fs)
	c.weightsAtUpload = func() bool { return true } // run opens a deployment
	m, path, code := parseManifest(c, args, stdout, stderr)
	if code >= 0 {
		return code
	}
	if *only != "" && m.Session(*only) == nil && m.Resident(*only) == nil {
		fmt.Fprintf(stderr, "stagehost run: %s has no session or resident session %q\n", path, *only)
		return exitUsage
	}
	if *inputFile != "" && (*only == "" || m.Session(*only) == nil) {
		fmt.Fprintln(stderr, "stagehost run: --input needs --session naming a session")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, code := open(ctx, m, *only, *quiet, newLogger(stderr, level.Level), stderr)
	if d == nil {
		return code
	}
	defer d.Close(context.Background())

	failed, notCreated := false, false
	for _, name := range d.SessionNames() {
		s := d.Pool(name)
		if err := s.Failed(); err != nil {
			notCreated = true
			fmt.Fprintf(stdout, "session %s: FAILED: could not be created: %s\n", name, firstLine(err))
			continue
		}
		input, err := s.DefaultInput()
		if *inputFile != "" {
			if input, err = manifest.ReadFile(*inputFile, manifest.MaxInputSize); err != nil {
				fmt.Fprintf(stderr, "stagehost run: --input: %v\n", err)
				return exitInvalid
			}
		}
		if err != nil {
			fmt.Fprintf(stderr, "session %s: input: %v\n", name, err)
			return exitInvalid
		}
		start := time.Now()
		out, err := s.Run(ctx, input)
		took := time.Since(start)
		if err != nil {
			failed = true
			fmt.Fprintf(stdout, "session %s: FAILED after %v: %v\n", name, took.Round(time.Microsecond), err)
			continue
		}
		fmt.Fprintf(stdout, "session %s: ok in %v, %s in, %s out\n", name, took.Round(time.Microsecond), plural(len(input), "byte"), plural(len(out), "byte"))
		fmt.Fprintf(stdout, "  output: %s\n", formatOutput(s.Spec.OutputFormat, out))
	}
	for _, name := range d.ResidentNames() {
		run, err := d.Resident(name).Run(ctx)
		if err != nil {
			failed = true
			fmt.Fprintf(stdout, "resident %s: FAILED: %v\n", name, err)
			continue
		}
		fmt.Fprintf(stdout, "resident %s: %s exchanged and verified in %v\n", name, plural(run.Rounds, "round"), run.Duration.Round(time.Microsecond))
	}
	printSummary(stdout, d.Runtime.Tracer().Summary())
	if *traceFile != "" {
		if err := writeTrace(*traceFile, d.Runtime.Tracer()); err != nil {
			fmt.Fprintf(stderr, "trace: %v\n", err)
			return exitFailed
		}
		fmt.Fprintf(stdout, "trace written to %s (open it in https://ui.perfetto.dev)\n", *traceFile)
	}
	if notCreated {
		fmt.Fprintf(stderr, "stagehost run: %d of %s could not be created\n", len(d.FailedSessions()), plural(len(d.SessionNames()), "session"))
		return exitStartup
	}
	if failed {
		return exitFailed
	}
	return exitOK
}

// firstLine returns the first line of err's message (a trap's message
// goes on with the guest's stack trace, which the log has).
func firstLine(err error) string {
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

func writeTrace(path string, t *host.Tracer) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := t.WriteChromeTrace(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// formatOutput renders a session's output by its manifest output_format.
func formatOutput(format string, out []byte) string {
	switch format {
	case "text":
		if utf8.Valid(out) {
			return fmt.Sprintf("%q", out)
		}
	case "f32":
		if len(out)%4 == 0 {
			return fmt.Sprint(float32s(out))
		}
	case "class":
		if len(out) >= 4 && len(out)%4 == 0 {
			return fmt.Sprintf("class %d, scores %v", binary.LittleEndian.Uint32(out), float32s(out[4:]))
		}
	}
	const max = 64
	if len(out) > max {
		return hex.EncodeToString(out[:max]) + fmt.Sprintf("… (%d bytes)", len(out))
	}
	return hex.EncodeToString(out)
}

func float32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func printSummary(w io.Writer, sum []host.LaneSummary) {
	fmt.Fprintln(w, "\nlane summary:")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "lane\tcount\tfailed\tbusy\twait p50\twait p99\t")
	for _, s := range sum {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%v\t%v\t\n", s.Lane, s.Count, s.Failed,
			s.Busy.Round(time.Microsecond), s.WaitP50.Round(time.Microsecond), s.WaitP99.Round(time.Microsecond))
	}
	tw.Flush()
}

func cmdServe(args []string, stdout, stderr io.Writer) int {
	c := newCommand("serve", "FILE [flags]", "Serve the manifest's sessions and resident sessions over HTTP (see docs/service.md).")
	fs := c.fs
	addr := fs.String("addr", "127.0.0.1:8080", "listen `address`, HOST:PORT")
	grace := fs.Duration("grace", 30*time.Second, "how long SIGTERM waits for accepted requests; those still running then are answered 503 unavailable")
	quiet := fs.Bool("quiet", false, "print no progress (module loading) on stderr; results and errors still show")
	level := logLevelFlag(fs)
	tlsCert := fs.String("tls-cert", "", "serve HTTPS with this PEM certificate `file` (with --tls-key; overrides service.tls_cert)")
	tlsKey := fs.String("tls-key", "", "the PEM private key `file` of --tls-cert (overrides service.tls_key)")
	adminFile := fs.String("admin-token-file", "", "bearer tokens of scope admin, one a line, in `file` (overrides service.admin_token_file)")
	invokeFile := fs.String("invoke-token-file", "", "bearer tokens of scope invoke, one a line, in `file` (overrides service.invoke_token_file)")
	hostID := fs.String("host-id", "", "this host's `id` in the manifest's [lattice] (overrides lattice.host_id; default the hostname and process id)")
	insecure := fs.Bool("insecure-no-auth", false, "serve a non-loopback --addr without any token (every route open to anyone who can connect)")
	supervised := fs.Bool("supervise", false, "supervise a worker process per [[device]] (serve --worker), joined over the lattice (an embedded NATS server unless the manifest has [lattice]); this process opens no device and routes every call through the lattice (docs/lattice.md)")
	worker := fs.String("worker", "", "internal: run as serve --supervise's worker of `DEVICE`")
	tenant := fs.String("tenant", "", "internal: with --worker, serve only the sessions of tenant `NAME` (default: those without a tenant, and the residents)")
	stateDir := fs.String("state-dir", "", "keep the model state (uploaded modules, swaps) in `DIR` and restore it at the next start (with --supervise: when a worker or the supervisor restarts; \"off\" keeps it only while the supervisor runs; default USER_CACHE_DIR/stagehost/state/KEY, KEY from the manifest's path. Without --supervise: default none; docs/service.md, \"Model state\")")
	// A supervisor uploads nothing (its workers do, each loading the
	// manifest again): it checks every weights file when it loads.
	c.weightsAtUpload = func() bool { return !*supervised }
	m, path, code := parseManifest(c, args, stdout, stderr)
	if code >= 0 {
		return code
	}
	logger := newLogger(stderr, level.Level)
	if *tenant != "" && *worker == "" {
		fmt.Fprintln(stderr, "stagehost serve: --tenant needs --worker (serve --supervise starts a worker per device and tenant)")
		return exitUsage
	}
	if *worker != "" {
		if *supervised {
			fmt.Fprintln(stderr, "stagehost serve: --supervise and --worker exclude each other")
			return exitUsage
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return serveWorker(ctx, m, *worker, *tenant, *hostID, *stateDir, *grace, *quiet, logger, stdout, stderr)
	}
	if err := checkListenAddr(*addr); err != nil {
		fmt.Fprintf(stderr, "stagehost serve: --addr %q is not a valid address: %v\n", *addr, err)
		return exitUsage
	}
	cfg, code := serviceConfig(m, *tlsCert, *tlsKey, *adminFile, *invokeFile, stderr)
	if code >= 0 {
		return code
	}
	if len(cfg.AdminTokens)+len(cfg.InvokeTokens) == 0 && !manifest.LoopbackAddr(*addr) {
		if !*insecure {
			fmt.Fprintf(stderr, "stagehost serve: refusing to serve %s without authentication: it is not a loopback address. Configure tokens (--admin-token-file, --invoke-token-file, or service.*_token_file/_env in the manifest), or pass --insecure-no-auth\n", *addr)
			return exitUsage
		}
		fmt.Fprintf(stderr, "stagehost serve: WARNING: --insecure-no-auth: every route on %s, /metrics, /debug/trace and resident starts included, is open to anyone who can connect\n", *addr)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *supervised {
		return serveSupervisor(ctx, stop, m, path, *addr, cfg, supervisorFlags{hostID: *hostID, level: level.String(), grace: *grace, quiet: *quiet, stateDir: *stateDir}, logger, stdout, stderr)
	}
	if bad := needsWorker(m); len(bad) > 0 {
		fmt.Fprintf(stderr, "stagehost serve: %s: untrusted device code needs a process of its own: serve it with --supervise (docs/security.md)\n", strings.Join(bad, "; "))
		return exitUsage
	}
	// Spans (the manifest's [tracing]) are flushed when serve returns:
	// after the service has drained and the host has left its lattice.
	id, latticeName := memberID(m, *hostID), ""
	if m.Lattice != nil {
		latticeName = m.Lattice.Name
	}
	tp, code := startTracing(m, id, latticeName, logger, stderr)
	if code >= 0 {
		return code
	}
	defer stopTracing(tp, stderr)
	cfg.TracerProvider = tp.TracerProvider()
	// Listen first: while modules load and sessions are made, /livez
	// answers 200 and /readyz 503 "starting".
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: %v\n", err)
		return exitStartup
	}
	srv := service.NewStartingServer(logger, cfg)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln, *grace) }()
	d, code := open(ctx, m, "", *quiet, logger, stderr)
	if d == nil {
		stop()
		<-served
		return code
	}
	if *stateDir != "" && *stateDir != stateDirOff {
		// Applied before the service attaches: the first call runs
		// what was recorded.
		dir, err := filepath.Abs(*stateDir)
		if err != nil {
			stop()
			<-served
			d.Close(context.Background())
			fmt.Fprintf(stderr, "stagehost serve: --state-dir: %v\n", err)
			return exitStartup
		}
		store := modelctl.OpenDir(dir)
		r := modelctl.Restore(ctx, d, store, logger)
		for _, line := range r.Applied {
			fmt.Fprintln(stdout, line)
		}
		for _, line := range r.Notes {
			fmt.Fprintf(stderr, "stagehost serve: model state: %s\n", line)
		}
		srv.SetModelControl(service.LocalModelControl(d, store, logger))
	}
	srv.Attach(d)
	var early error
	ended := false
	select {
	case early = <-served: // it could not serve at all, or a signal came during start-up
		ended = true
	default:
	}
	if early != nil {
		d.Close(context.Background())
		fmt.Fprintf(stderr, "stagehost serve: %v\n", early)
		return exitStartup
	}
	finishLattice := func() {}
	if m.Lattice != nil && !ended {
		member, finish, err := service.JoinLattice(ctx, m, d, srv, id, *grace, tp.TracerProvider(), logger)
		if err != nil {
			stop()
			<-served
			d.Close(context.Background())
			fmt.Fprintf(stderr, "stagehost serve: %v\n", err)
			return exitStartup
		}
		finishLattice = finish
		fmt.Fprintf(stdout, "joined lattice %s as host %s\n", m.Lattice.Name, member.Host().ID())
	}
	for _, name := range d.FailedSessions() {
		fmt.Fprintf(stderr, "stagehost serve: session %s could not be created (it answers 503): %s\n", name, firstLine(d.Pool(name).Failed()))
	}
	failedNote := ""
	if n := len(d.FailedSessions()); n > 0 {
		failedNote = fmt.Sprintf(", %d of them failed", n)
	}
	scheme := "http"
	if cfg.TLSCert != "" {
		scheme = "https"
	}
	fmt.Fprintf(stdout, "serving %s on %s://%s (%s%s, %s)\n",
		path, scheme, ln.Addr(), plural(len(m.Sessions), "session"), failedNote, plural(len(m.Residents), "resident session"))
	if !ended {
		err = <-served
	}
	finishLattice() // the host has left; the connection closes
	cerr := d.Close(context.Background())
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: %v\n", err)
		return exitFailed
	}
	if cerr != nil {
		fmt.Fprintf(stderr, "stagehost serve: closing: %v\n", cerr)
	}
	fmt.Fprintln(stdout, stoppedLine(srv))
	return exitOK
}

// stoppedLine is serve's last line: the requests accepted and answered,
// and those the end of --grace cut off (answered 503).
func stoppedLine(srv *service.Server) string {
	accepted, answered := srv.Counts()
	line := fmt.Sprintf("stopped: %s accepted, %d answered", plural(int(accepted), "request"), answered)
	if n := srv.CutOff(); n > 0 {
		line += fmt.Sprintf(", %d of them cut off when --grace ran out (answered 503 unavailable)", n)
	}
	return line
}

// checkListenAddr checks that addr is HOST:PORT with a port of 0–65535
// (an empty HOST: every address); whether HOST resolves is for the
// listener to find.
func checkListenAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("want HOST:PORT, such as 127.0.0.1:8080")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || port != strconv.FormatUint(n, 10) {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("host %q is not a host name or IP address", host)
	}
	return nil
}

// serviceConfig is the manifest's [service] with the flags over it, its
// tokens read and its TLS pair checked. On failure it returns the exit
// code (-1 on success): 64 for a flag without its partner, 65 for a file
// or variable that cannot be used.
func serviceConfig(m *manifest.Manifest, tlsCert, tlsKey, adminFile, invokeFile string, stderr io.Writer) (service.Config, int) {
	cfg := service.ConfigFromManifest(m)
	sv := m.Service
	if (tlsCert == "") != (tlsKey == "") {
		fmt.Fprintln(stderr, "stagehost serve: --tls-cert and --tls-key go together")
		return cfg, exitUsage
	}
	// Each file is named as the operator named it: the flag, or the
	// manifest's key.
	certSrc, keySrc := "service.tls_cert", "service.tls_key"
	if tlsCert != "" {
		cfg.TLSCert, cfg.TLSKey = tlsCert, tlsKey
		certSrc, keySrc = "--tls-cert", "--tls-key"
	}
	if cfg.TLSCert != "" {
		for _, f := range []struct{ src, path string }{{certSrc, cfg.TLSCert}, {keySrc, cfg.TLSKey}} {
			if _, err := manifest.ReadFile(f.path, manifest.MaxTLSFileSize); err != nil {
				fmt.Fprintf(stderr, "stagehost serve: %s: %v\n", f.src, err)
				return cfg, exitInvalid
			}
		}
		if _, err := service.LoadKeyPair(cfg.TLSCert, cfg.TLSKey); err != nil {
			fmt.Fprintf(stderr, "stagehost serve: %s %s and %s %s: %v\n", certSrc, cfg.TLSCert, keySrc, cfg.TLSKey, err)
			return cfg, exitInvalid
		}
	}
	adminSrc, invokeSrc := "service.admin_token_file", "service.invoke_token_file"
	if adminFile != "" {
		sv.AdminTokenFile, adminSrc = adminFile, "--admin-token-file"
	}
	if invokeFile != "" {
		sv.InvokeTokenFile, invokeSrc = invokeFile, "--invoke-token-file"
	}
	var err error
	if sv.AdminTokenFile != "" || sv.AdminTokenEnv != "" {
		if cfg.AdminTokens, err = deploy.ReadTokens(sv.AdminTokenFile, sv.AdminTokenEnv); err != nil {
			fmt.Fprintf(stderr, "stagehost serve: admin tokens (%s): %v\n", tokenSource(adminSrc, sv.AdminTokenFile, "service.admin_token_env", sv.AdminTokenEnv), err)
			return cfg, exitInvalid
		}
	}
	if sv.InvokeTokenFile != "" || sv.InvokeTokenEnv != "" {
		if cfg.InvokeTokens, err = deploy.ReadTokens(sv.InvokeTokenFile, sv.InvokeTokenEnv); err != nil {
			fmt.Fprintf(stderr, "stagehost serve: invoke tokens (%s): %v\n", tokenSource(invokeSrc, sv.InvokeTokenFile, "service.invoke_token_env", sv.InvokeTokenEnv), err)
			return cfg, exitInvalid
		}
	}
	return cfg, -1
}

// tokenSource names where a scope's tokens come from, for messages: the
// flag or key of the file, and the key of the variable.
func tokenSource(fileSrc, file, envSrc, env string) string {
	var parts []string
	if file != "" {
		parts = append(parts, fileSrc+" "+file)
	}
	if env != "" {
		parts = append(parts, envSrc+" "+env)
	}
	return strings.Join(parts, ", ")
}

func cmdTrace(args []string, stdout, stderr io.Writer) int {
	c := newCommand("trace", "FILE", "Summarise a trace saved by run --trace or GET /debug/trace: lanes, and occupancies\nby device, lane and owner.")
	path, code := c.parse(args, stdout, stderr)
	if code >= 0 {
		return code
	}
	// A trace is read as a stream; only a regular file will end, and a
	// named pipe is refused, never waited on.
	f, _, err := manifest.OpenFile(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	defer f.Close()
	recs, err := host.ReadChromeTrace(f)
	if err != nil {
		fmt.Fprintf(stderr, "%s: not a stagehost trace: %v\n", path, err)
		return exitInvalid
	}
	fmt.Fprintf(stdout, "%s: %s\n", path, plural(len(recs), "lane occupancy|lane occupancies"))
	owners := map[string]int{}
	var order []string
	for _, r := range recs {
		key := r.Device + "/" + r.Lane.String() + "/" + r.Owner
		if owners[key] == 0 {
			order = append(order, key)
		}
		owners[key]++
	}
	printSummary(stdout, host.SummarizeRecords(recs))
	fmt.Fprintln(stdout, "\noccupancies by device/lane/owner:")
	for _, k := range order {
		fmt.Fprintf(stdout, "  %-40s %d\n", strings.TrimPrefix(k, "/"), owners[k])
	}
	return exitOK
}

func cmdVersion(args []string, stdout, stderr io.Writer) int {
	c := newCommand("version", "", "Print the versions of stagehost, of the guest ABI it implements, and of wazero.")
	c.nargs = 0
	if _, code := c.parse(args, stdout, stderr); code >= 0 {
		return code
	}
	bi, ok := debug.ReadBuildInfo()
	fmt.Fprintf(stdout, "stagehost %s\nABI v%d\nwazero %s\n", version, abi.Version, wazeroVersion(bi, ok))
	return exitOK
}

// wazeroVersion returns the version of wazero in the build info, or
// "unknown" when there is none (some test binaries, or a build without
// module support).
func wazeroVersion(bi *debug.BuildInfo, ok bool) string {
	const path = "github.com/tetratelabs/wazero"
	if !ok || bi == nil {
		return "unknown"
	}
	for _, m := range bi.Deps {
		if m.Path != path {
			continue
		}
		if m.Replace != nil && m.Replace.Version != "" {
			return m.Replace.Version
		}
		if m.Version != "" {
			return m.Version
		}
	}
	return "unknown"
}

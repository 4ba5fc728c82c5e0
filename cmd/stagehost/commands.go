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
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/stagehost/stagehost/host"
	"github.com/stagehost/stagehost/sessions/deploy"
	"github.com/stagehost/stagehost/sessions/manifest"
)

// parse parses flags that may come before or after the one positional
// argument (the manifest or trace file). On failure it returns the exit
// code: exitOK for -h, exitUsage otherwise.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) (string, int) {
	fs.SetOutput(stderr)
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return "", exitOK
			}
			return "", exitUsage
		}
		args = fs.Args()
		if len(args) > 0 {
			pos = append(pos, args[0])
			args = args[1:]
		}
	}
	if len(pos) != 1 {
		fmt.Fprintf(stderr, "stagehost %s: want exactly one FILE argument, got %d\n", fs.Name(), len(pos))
		return "", exitUsage
	}
	return pos[0], -1
}

// parseManifest parses the flags and the one FILE argument, and loads that
// manifest; it reports every problem on stderr. On failure it returns the
// exit code (-1 on success).
func parseManifest(fs *flag.FlagSet, args []string, stderr io.Writer) (*manifest.Manifest, string, int) {
	path, code := parse(fs, args, stderr)
	if code >= 0 {
		return nil, "", code
	}
	m, err := manifest.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, "", exitInvalid
	}
	return m, path, -1
}

func cmdCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	m, path, code := parseManifest(fs, args, stderr)
	if code >= 0 {
		return code
	}
	fmt.Fprintf(stdout, "%s: ok: %d devices, %d modules, %d sessions, %d resident sessions\n",
		path, len(m.Devices), len(m.Modules), len(m.Sessions), len(m.Residents))
	for _, mod := range m.Modules {
		fmt.Fprintf(stdout, "  module %-12s %-5s %8d bytes  sha256 %s…  ABI v1 ok\n", mod.Name, mod.Kind, len(mod.Bytes), mod.SHA256[:12])
	}
	return exitOK
}

func newLogger(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func open(ctx context.Context, m *manifest.Manifest, stderr io.Writer) (*deploy.Deployment, int) {
	d, err := deploy.Open(ctx, m, deploy.Options{
		Logger:   newLogger(stderr),
		Progress: func(msg string) { fmt.Fprintln(stderr, msg) },
	})
	if err != nil {
		fmt.Fprintf(stderr, "stagehost: cannot start: %v\n", err)
		return nil, exitStartup
	}
	return d, exitOK
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	only := fs.String("session", "", "run only this session or resident session")
	inputFile := fs.String("input", "", "input file for the session")
	traceFile := fs.String("trace", "", "write a Chrome/Perfetto trace here")
	m, path, code := parseManifest(fs, args, stderr)
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
	d, code := open(ctx, m, stderr)
	if d == nil {
		return code
	}
	defer d.Close(context.Background())

	failed, notCreated := false, false
	for _, name := range d.SessionNames() {
		if *only != "" && name != *only {
			continue
		}
		s := d.Session(name)
		if err := s.Failed(); err != nil {
			notCreated = true
			fmt.Fprintf(stdout, "session %s: FAILED: could not be created: %s\n", name, firstLine(err))
			continue
		}
		input, err := s.DefaultInput()
		if *inputFile != "" {
			input, err = manifest.ReadFile(*inputFile, manifest.MaxInputSize)
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
		fmt.Fprintf(stdout, "session %s: ok in %v, %d bytes in, %d bytes out\n", name, took.Round(time.Microsecond), len(input), len(out))
		fmt.Fprintf(stdout, "  output: %s\n", formatOutput(s.Spec.OutputFormat, out))
	}
	for _, name := range d.ResidentNames() {
		if *only != "" && name != *only {
			continue
		}
		run, err := d.Resident(name).Run(ctx)
		if err != nil {
			failed = true
			fmt.Fprintf(stdout, "resident %s: FAILED: %v\n", name, err)
			continue
		}
		fmt.Fprintf(stdout, "resident %s: %d rounds exchanged and verified in %v\n", name, run.Rounds, run.Duration.Round(time.Microsecond))
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
		fmt.Fprintf(stderr, "stagehost run: %d of %d sessions could not be created\n", len(d.FailedSessions()), len(d.SessionNames()))
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
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	grace := fs.Duration("grace", 30*time.Second, "how long SIGTERM waits for accepted requests")
	m, path, code := parseManifest(fs, args, stderr)
	if code >= 0 {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	d, code := open(ctx, m, stderr)
	if d == nil {
		return code
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: %v\n", err)
		d.Close(context.Background())
		return exitStartup
	}
	for _, name := range d.FailedSessions() {
		fmt.Fprintf(stderr, "stagehost serve: session %s could not be created (it answers 503): %s\n", name, firstLine(d.Session(name).Failed()))
	}
	failedNote := ""
	if n := len(d.FailedSessions()); n > 0 {
		failedNote = fmt.Sprintf(", %d of them failed", n)
	}
	fmt.Fprintf(stdout, "serving %s on http://%s (%d sessions%s, %d resident sessions)\n",
		path, ln.Addr(), len(m.Sessions), failedNote, len(m.Residents))
	srv := deploy.NewServer(d, newLogger(stderr))
	err = srv.Serve(ctx, ln, *grace)
	cerr := d.Close(context.Background())
	if err != nil {
		fmt.Fprintf(stderr, "stagehost serve: %v\n", err)
		return exitFailed
	}
	if cerr != nil {
		fmt.Fprintf(stderr, "stagehost serve: closing: %v\n", cerr)
	}
	accepted, answered := srv.Counts()
	fmt.Fprintf(stdout, "stopped: %d requests accepted, %d answered\n", accepted, answered)
	return exitOK
}

func cmdTrace(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("trace", flag.ContinueOnError)
	path, code := parse(fs, args, stderr)
	if code >= 0 {
		return code
	}
	// A trace is read as a stream; only a regular file will end.
	if fi, err := os.Stat(path); err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	} else if !fi.Mode().IsRegular() {
		fmt.Fprintf(stderr, "%s: not a regular file\n", path)
		return exitInvalid
	}
	f, err := os.Open(path)
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
	fmt.Fprintf(stdout, "%s: %d lane occupancies\n", path, len(recs))
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

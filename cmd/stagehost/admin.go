package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/service"
)

// exitUnreachable is admin's exit code when the server cannot be reached
// or does not answer as the service does (sysexits EX_UNAVAILABLE).
const exitUnreachable = 69

// adminCommands are admin's subcommands and their positional arguments.
var adminCommands = map[string][]string{
	"modules": nil,
	"load":    {"NAME", "PATH"},
	"upload":  {"NAME", "FILE"},
	"unload":  {"NAME[@SHA256]"},
	"swap":    {"SESSION", "MODULE"},
	"reset":   {"SESSION"},
	"workers": nil,
	"status":  nil,
}

const adminAbout = `Model control of a running stagehost serve, through its admin routes
(docs/service.md, "Model control"). Commands:

  modules                  list the loaded module versions and the sessions using each
  load NAME PATH           load PATH, a file on the server's machine (absolute, or relative
                           to the manifest's directory), as a version of module NAME;
                           --sha256 gives its sha256 (default: computed from PATH read here)
  upload NAME FILE         upload FILE as a version of module NAME (its sha256 computed here)
                           (load and upload: --kind stage|fence and --wasi GRANT as the
                           manifest's [[module]] keys kind and wasi; default: those of the
                           name's newest version, else a stage module with no grant;
                           --memory-limit SIZE and --snapshot true|false likewise)
  unload NAME[@SHA256]     unload one version, or every version of NAME (refused while used)
  swap SESSION MODULE      swap SESSION to MODULE (NAME: its newest version, or NAME@SHA256);
                           calls in flight finish on the old version; in a lattice, on every
                           host (answered once each acknowledged), or with --host-only on
                           the addressed host only
  reset SESSION            replace SESSION's quarantined or failed instances by fresh ones
  workers                  a supervisor's (serve --supervise) workers: pid, state, restarts,
                           uptime, devices, sessions, last exit and its reason
  status                   the status page's content as JSON (GET /v1/status)

Under serve --supervise, each command reaches the workers: modules lists
theirs, load and upload load on every ready worker, swap and reset act on
the workers that serve the session (docs/service.md, "Model control under
--supervise").

The bearer token: the first token of --token-file FILE (one per line), else
of the variable --token-env NAME (tokens separated by commas or spaces, as
the manifest's admin_token_env), else of $STAGEHOST_ADMIN_TOKEN when it is
set, else none. --token-file and --token-env together are bad usage. The
token is never printed.

Exit codes: 0 done; 1 the server refused the request (its message and class
on stderr); 64 bad usage; 65 a local file (FILE, PATH, --token-file) cannot
be read, or the token variable is empty or holds a token shorter than 16
bytes; 69 the server cannot be reached.`

// defaultTokenEnv is the variable admin takes its token from when no
// --token-file or --token-env is given (and the variable is set).
const defaultTokenEnv = "STAGEHOST_ADMIN_TOKEN"

// grantsFlag is a repeatable flag: each use adds grants (comma-separated).
type grantsFlag []string

func (g *grantsFlag) String() string { return strings.Join(*g, ",") }

func (g *grantsFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			return fmt.Errorf("an empty grant")
		}
		*g = append(*g, s)
	}
	return nil
}

func cmdAdmin(args []string, stdout, stderr io.Writer) int {
	c := newCommand("admin", "[flags] COMMAND [ARGS]", adminAbout)
	addr := c.fs.String("addr", "http://127.0.0.1:8080", "the server's base `URL` (a bare host:port means http://host:port)")
	tokenFile := c.fs.String("token-file", "", "send the first token of `FILE` (one per line, # comments) as the bearer token")
	tokenEnv := c.fs.String("token-env", "", "send the first token of the environment variable `NAME` (tokens separated by commas or spaces) as the bearer token (default: $"+defaultTokenEnv+" when set)")
	kind := c.fs.String("kind", "", "load, upload: the module's `KIND`, stage or fence (default: the name's newest version's, else stage)")
	var wasi grantsFlag
	c.fs.Var(&wasi, "wasi", "load, upload: a WASI `GRANT` (go-runtime, or one function such as fd_write); repeated or comma-separated for several (default: the name's newest version's, else none)")
	sum := c.fs.String("sha256", "", "load: the module's `SHA256` (default: computed from PATH read here)")
	memLimit := c.fs.String("memory-limit", "", "load, upload: the module's memory limit, a `SIZE` with its unit, as the manifest's memory_limit (\"128MiB\"; default: the name's newest version's, else 64MiB)")
	snapshot := c.fs.String("snapshot", "", "load, upload: `true` or false, as the manifest's snapshot (default: the name's newest version's, else true)")
	timeout := c.fs.Duration("timeout", 5*time.Minute, "give up on the server's answer after this `duration`")
	hostOnly := c.fs.Bool("host-only", false, "swap: in a lattice, swap the session on the addressed host only (default: on every host of the lattice)")
	asJSON := c.fs.Bool("json", false, "print the server's JSON answer (modules prints a table by default)")
	fs := c.fs
	fs.SetOutput(stderr)
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.printUsage(stdout)
				return exitOK
			}
			fmt.Fprintln(stderr)
			c.printUsage(stderr)
			return exitUsage
		}
		args = fs.Args()
		if len(args) > 0 {
			pos = append(pos, args[0])
			args = args[1:]
		}
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "stagehost admin: "+format+"\n\n", a...)
		c.printUsage(stderr)
		return exitUsage
	}
	if len(pos) == 0 {
		return usageErr("want a COMMAND")
	}
	want, ok := adminCommands[pos[0]]
	if !ok {
		return usageErr("unknown command %q", pos[0])
	}
	if len(pos)-1 != len(want) {
		return usageErr("%s takes %d arguments (%s), got %d", pos[0], len(want), strings.Join(want, " "), len(pos)-1)
	}
	if *sum != "" && pos[0] != "load" && pos[0] != "upload" {
		return usageErr("--sha256 is for load and upload")
	}
	if (*kind != "" || wasi != nil) && pos[0] != "load" && pos[0] != "upload" {
		return usageErr("--kind and --wasi are for load and upload")
	}
	if *kind != "" && *kind != "stage" && *kind != "fence" {
		return usageErr("--kind %q: want stage or fence", *kind)
	}
	if (*memLimit != "" || *snapshot != "") && pos[0] != "load" && pos[0] != "upload" {
		return usageErr("--memory-limit and --snapshot are for load and upload")
	}
	var memBytes *int64
	if *memLimit != "" {
		n, err := manifest.ParseSize(*memLimit)
		if err != nil {
			return usageErr("--memory-limit %q: %v", *memLimit, err)
		}
		memBytes = &n
	}
	var snap *bool
	if *snapshot != "" {
		b, err := strconv.ParseBool(*snapshot)
		if err != nil {
			return usageErr("--snapshot %q: want true or false", *snapshot)
		}
		snap = &b
	}
	if *tokenFile != "" && *tokenEnv != "" {
		return usageErr("--token-file and --token-env: give one")
	}
	base := strings.TrimRight(*addr, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	if u, err := url.Parse(base); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usageErr("--addr %q: want http://HOST:PORT or https://HOST:PORT", *addr)
	}
	token := ""
	if *tokenFile != "" {
		toks, err := deploy.ReadTokens(*tokenFile, "")
		if err != nil {
			fmt.Fprintf(stderr, "stagehost admin: --token-file: %v\n", err)
			return exitInvalid
		}
		token = toks[0]
	} else {
		flagName, env := "--token-env "+*tokenEnv, *tokenEnv
		if env == "" {
			if _, set := os.LookupEnv(defaultTokenEnv); set {
				flagName, env = "$"+defaultTokenEnv, defaultTokenEnv
			}
		}
		if env != "" {
			// ReadTokens' errors name the variable, never a token.
			toks, err := deploy.ReadTokens("", env)
			if err != nil {
				fmt.Fprintf(stderr, "stagehost admin: %s: %v\n", flagName, err)
				return exitInvalid
			}
			token = toks[0]
		}
	}
	a := &adminClient{base: base, token: token, client: &http.Client{Timeout: *timeout}, stdout: stdout, stderr: stderr, json: *asJSON,
		kind: *kind, wasi: wasi, memoryLimit: memBytes, snapshot: snap}
	arg := pos[1:]
	switch pos[0] {
	case "modules":
		return a.modules()
	case "load":
		return a.load(arg[0], arg[1], *sum)
	case "upload":
		return a.upload(arg[0], arg[1], *sum)
	case "unload":
		return a.do("DELETE", "/v1/modules/"+url.PathEscape(arg[0]), "", nil, -1, nil)
	case "swap":
		body, _ := json.Marshal(service.SwapRequest{Stage: arg[1], HostOnly: *hostOnly})
		return a.do("POST", "/v1/sessions/"+url.PathEscape(arg[0])+"/swap", "application/json", bytes.NewReader(body), int64(len(body)), nil)
	case "reset":
		return a.do("POST", "/v1/sessions/"+url.PathEscape(arg[0])+"/reset", "", nil, 0, nil)
	case "workers":
		return a.workers()
	case "status":
		return a.do("GET", "/v1/status", "", nil, -1, nil)
	}
	return exitUsage // not reached: every command is above
}

type adminClient struct {
	base, token string
	client      *http.Client
	stdout      io.Writer
	stderr      io.Writer
	json        bool
	// kind and wasi: load's and upload's --kind and --wasi ("" and nil:
	// not given, the server keeps the name's newest version's).
	kind string
	wasi []string
	// memoryLimit and snapshot: --memory-limit and --snapshot (nil: not
	// given).
	memoryLimit *int64
	snapshot    *bool
}

// do sends one request. A 2xx answer is printed (or given to show); an
// error answer's message and class go to stderr and exit 1.
func (a *adminClient) do(method, path, contentType string, body io.Reader, length int64, show func([]byte) error) int {
	req, err := http.NewRequest(method, a.base+path, body)
	if err != nil {
		fmt.Fprintf(a.stderr, "stagehost admin: %v\n", err)
		return exitUsage
	}
	if length >= 0 {
		req.ContentLength = length
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		fmt.Fprintf(a.stderr, "stagehost admin: the server cannot be reached: %v\n", err)
		return exitUnreachable
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		fmt.Fprintf(a.stderr, "stagehost admin: reading the answer: %v\n", err)
		return exitUnreachable
	}
	if resp.StatusCode >= 300 {
		var e service.ErrorBody
		if json.Unmarshal(b, &e) != nil || e.Class == "" {
			fmt.Fprintf(a.stderr, "stagehost admin: %s %s: HTTP %d, not the service's JSON error: %.200s\n", method, path, resp.StatusCode, b)
			return exitUnreachable
		}
		fmt.Fprintf(a.stderr, "stagehost admin: %s (class %s, HTTP %d, request %s)\n", e.Error, e.Class, resp.StatusCode, e.RequestID)
		return exitFailed
	}
	if show != nil && !a.json {
		if err := show(b); err != nil {
			fmt.Fprintf(a.stderr, "stagehost admin: the answer: %v\n", err)
			return exitUnreachable
		}
		return exitOK
	}
	_, _ = a.stdout.Write(b)
	return exitOK
}

func (a *adminClient) modules() int {
	return a.do("GET", "/v1/modules", "", nil, -1, func(b []byte) error {
		var list struct{ Modules []deploy.ModuleInfo }
		if err := json.Unmarshal(b, &list); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSHA256\tKIND\tSIZE\tSOURCE\tSESSIONS")
		for _, m := range list.Modules {
			name := m.Name
			if m.Newest {
				name += " *"
			}
			users := strings.Join(m.Sessions, ",")
			if users == "" {
				users = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", name, m.SHA256, m.Kind, m.Size, m.Source, users)
		}
		fmt.Fprintln(tw, "(* the newest version of a name, which swap NAME takes)")
		return tw.Flush()
	})
}

func (a *adminClient) load(name, path, sum string) int {
	if sum == "" {
		local := path
		if !filepath.IsAbs(local) {
			fmt.Fprintf(a.stderr, "stagehost admin: load: without --sha256, PATH must be absolute (it is read here to compute the sha256; the server reads a relative PATH from the manifest's directory)\n")
			return exitUsage
		}
		b, err := manifest.ReadFile(local, 1<<40)
		if err != nil {
			fmt.Fprintf(a.stderr, "stagehost admin: load: computing the sha256: %v\n", err)
			return exitInvalid
		}
		s := sha256.Sum256(b)
		sum = hex.EncodeToString(s[:])
	}
	body, _ := json.Marshal(deploy.ModuleRequest{Name: name, Path: path, SHA256: sum, Kind: a.kind, WASI: a.wasi, MemoryLimit: a.memoryLimit, Snapshot: a.snapshot})
	return a.do("POST", "/v1/modules", "application/json", bytes.NewReader(body), int64(len(body)), nil)
}

// upload streams FILE with its sha256, computed here (and checked against
// --sha256 when given).
func (a *adminClient) upload(name, file, want string) int {
	// A named pipe or a device is refused, never waited on.
	f, _, err := manifest.OpenFile(file)
	if err != nil {
		fmt.Fprintf(a.stderr, "stagehost admin: upload: %v\n", err)
		return exitInvalid
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		fmt.Fprintf(a.stderr, "stagehost admin: upload: %v\n", err)
		return exitInvalid
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if want != "" && !strings.EqualFold(want, sum) {
		fmt.Fprintf(a.stderr, "stagehost admin: upload: %s hashes to %s, not --sha256 %s\n", file, sum, want)
		return exitInvalid
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		fmt.Fprintf(a.stderr, "stagehost admin: upload: %v\n", err)
		return exitInvalid
	}
	q := url.Values{"sha256": {sum}}
	if a.kind != "" {
		q.Set("kind", a.kind)
	}
	for _, g := range a.wasi {
		q.Add("wasi", g)
	}
	if a.memoryLimit != nil {
		q.Set("memory_limit", strconv.FormatInt(*a.memoryLimit, 10))
	}
	if a.snapshot != nil {
		q.Set("snapshot", strconv.FormatBool(*a.snapshot))
	}
	return a.do("PUT", "/v1/modules/"+url.PathEscape(name)+"?"+q.Encode(), "application/wasm", io.LimitReader(f, n), n, nil)
}

// workers prints GET /v1/status's workers as a table (--json: the
// answer of GET /v1/workers, every field).
func (a *adminClient) workers() int {
	if a.json {
		return a.do("GET", "/v1/workers", "", nil, -1, nil)
	}
	return a.do("GET", "/v1/status", "", nil, -1, func(b []byte) error {
		var st struct {
			Workers []struct {
				Name, State, Uptime, Reason string
				PID, Restarts               int
				Devices, Sessions, Notes    []string
				LastExit                    string `json:"last_exit"`
				LastExitReason              string `json:"last_exit_reason"`
			}
		}
		if err := json.Unmarshal(b, &st); err != nil {
			return err
		}
		if st.Workers == nil {
			return errors.New("the server supervises no workers (it is not serve --supervise)")
		}
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKER\tPID\tSTATE\tRESTARTS\tUPTIME\tDEVICES\tSESSIONS\tLAST EXIT")
		dash := func(s string) string {
			if s == "" {
				return "-"
			}
			return s
		}
		for _, w := range st.Workers {
			pid := "-"
			if w.PID != 0 {
				pid = fmt.Sprint(w.PID)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", w.Name, pid, w.State, w.Restarts, dash(w.Uptime),
				dash(strings.Join(w.Devices, ",")), dash(strings.Join(w.Sessions, ",")), dash(w.LastExit))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, w := range st.Workers {
			if w.Reason != "" {
				fmt.Fprintf(a.stdout, "%s: %s\n", w.Name, w.Reason)
			} else if w.LastExitReason != "" {
				fmt.Fprintf(a.stdout, "%s: last exit: %s\n", w.Name, w.LastExitReason)
			}
			for _, n := range w.Notes {
				fmt.Fprintf(a.stdout, "%s: note: %s\n", w.Name, n)
			}
		}
		return nil
	})
}

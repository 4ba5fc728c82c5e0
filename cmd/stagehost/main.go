// Command stagehost checks, runs and serves stagehost manifests.
//
//	stagehost check FILE
//	stagehost run FILE [--session NAME] [--input FILE] [--trace out.json] [--quiet]
//	stagehost serve FILE [--addr 127.0.0.1:8080] [--grace 30s] [--quiet]
//	stagehost trace FILE
//	stagehost version
//	stagehost new go|c|rust NAME
//	stagehost admin [--addr URL] [--token-file FILE] modules|load|upload|unload|swap|reset ...
//
// Every command takes --help (or -h), which prints its usage and flags and
// exits 0. Progress goes to stderr, and run --quiet and serve --quiet drop
// it; results go to stdout.
//
// Exit codes:
//
//	0   success
//	1   a session or resident run failed (client error, trap, deadline, quarantine)
//	2   the process crashed: a Go panic or fatal error, such as running out
//	    of memory (a bug in stagehost, or too little memory); stagehost
//	    never exits with 2 by itself
//	3   the host could not start (a device, backend or module could not be
//	    set up), or, for run, a session could not be created
//	64  bad command-line usage (EX_USAGE)
//	65  the manifest, one of the files it names, or an input or trace file
//	    is invalid (EX_DATAERR)
//	69  admin could not reach the server, or its answer was not the
//	    service's (EX_UNAVAILABLE); admin exits 1 when the server refused
//	    the request (its JSON error's message and class on stderr), and 65
//	    when a local file (the module, --token-file) cannot be read
//	73  new could not write its project: NAME exists and is not an empty
//	    directory, or a file could not be written (EX_CANTCREAT)
//
// The Go runtime exits with 2 after an unrecovered panic or a fatal error,
// and that cannot be changed, so no code of stagehost's own is 2: a crash
// can never pass for an invalid manifest.
package main

import (
	"fmt"
	"io"
	"os"
)

// Exit codes. 2 is left to the Go runtime, which exits with it when the
// process crashes.
const (
	exitOK      = 0
	exitFailed  = 1
	exitCrash   = 2 // never returned: the Go runtime's status after a panic or fatal error
	exitStartup = 3
	exitUsage   = 64 // EX_USAGE
	exitInvalid = 65 // EX_DATAERR
)

// version is stagehost's version. It is a var so that release builds can
// set it:
//
//	go build -ldflags "-X main.version=1.2.0" ./cmd/stagehost
var version = "0.1.0-dev"

const usage = `stagehost: a host for sandboxed accelerator stages

Usage:
  stagehost check FILE                 validate a manifest and every module it names
      --print-sha256                   print each module's actual sha256 as a TOML line, exit 0
  stagehost run FILE [flags]           run the sessions (and resident sessions) once
      --session NAME                   only this session or resident session (loads only what it needs)
      --input FILE                     input for the session (default: its manifest input)
      --trace out.json                 write a Perfetto/Chrome trace
      --quiet                          no progress on stderr (results and errors still show)
      --log-level warn                 debug, info (guest logs), warn or error
  stagehost serve FILE [flags]         serve the manifest over HTTP (docs/service.md)
      --addr 127.0.0.1:8080            listen address, HOST:PORT (not loopback: needs tokens or --insecure-no-auth)
      --grace 30s                      how long SIGTERM waits for accepted requests (then: 503)
      --quiet                          no progress on stderr (results and errors still show)
      --log-level warn                 debug, info (guest logs, access log), warn or error
      --tls-cert FILE --tls-key FILE   serve HTTPS
      --admin-token-file FILE          bearer tokens of scope admin (also --invoke-token-file)
      --insecure-no-auth               allow a non-loopback --addr without tokens
  stagehost trace FILE                 summarise a saved trace
  stagehost version                    print the stagehost, ABI and wazero versions
  stagehost kernels [--markdown]       the kernels and their arguments (docs/kernels.md)
  stagehost new go|c|rust NAME         write a new guest project in NAME (docs/guest.md)
  stagehost admin [flags] COMMAND      model control of a running serve (docs/service.md):
      modules | load NAME PATH [--sha256 X] | upload NAME FILE | unload NAME[@SHA256]
      | swap SESSION MODULE | reset SESSION
      --addr http://127.0.0.1:8080     the server
      --token-file FILE                a file with an admin token
  stagehost requires set MODULE.wasm REQUIRES.toml -o OUT.wasm
                                       write a module's declared requirements (abi/ABI.md §7)
  stagehost requires show MODULE.wasm  print them
  stagehost COMMAND --help             a command's usage and flags

Exit codes:
  0   ok
  1   a session or resident run failed; (admin) the server refused the request
  2   stagehost crashed (a bug, or it ran out of memory)
  3   the host could not start, or (run) a session could not be created
  64  bad command-line usage
  65  the manifest, a file it names, or an input or trace file is invalid
  69  (admin) the server cannot be reached
  73  new could not write its project
`

// commands are the subcommands, for "stagehost help COMMAND".
var commands = map[string]bool{"check": true, "run": true, "serve": true, "trace": true, "version": true, "admin": true, "requires": true}

func main() { os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr)) }

// Main runs the command line args and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	switch args[0] {
	case "check":
		return cmdCheck(args[1:], stdout, stderr)
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "serve":
		return cmdServe(args[1:], stdout, stderr)
	case "trace":
		return cmdTrace(args[1:], stdout, stderr)
	case "version":
		return cmdVersion(args[1:], stdout, stderr)
	case "kernels":
		return cmdKernels(args[1:], stdout, stderr)
	case "new":
		return cmdNew(args[1:], stdout, stderr)
	case "admin":
		return cmdAdmin(args[1:], stdout, stderr)
	case "requires":
		return cmdRequires(args[1:], stdout, stderr)
	case "help", "-h", "-help", "--help":
		if len(args) == 2 && args[0] == "help" && commands[args[1]] {
			return Main([]string{args[1], "--help"}, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "stagehost: unknown command %q\n\n%s", args[0], usage)
	return exitUsage
}

// Command stagehost checks, runs and serves stagehost manifests.
//
//	stagehost check FILE
//	stagehost run FILE [--session NAME] [--input FILE] [--trace out.json]
//	stagehost serve FILE [--addr 127.0.0.1:8080]
//	stagehost trace FILE
//
// Exit codes:
//
//	0  success
//	1  a session or resident run failed (client error, trap, deadline, quarantine)
//	2  bad usage, or the manifest or one of its modules is invalid
//	3  the host could not start (device, backend or session creation failed)
package main

import (
	"fmt"
	"io"
	"os"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1
	exitInvalid = 2
	exitStartup = 3
)

const usage = `stagehost: a host for sandboxed accelerator stages

Usage:
  stagehost check FILE                 validate a manifest and every module it names
  stagehost run FILE [flags]           run the sessions (and resident sessions) once
      --session NAME                   only this session or resident session
      --input FILE                     input for the session (default: its manifest input)
      --trace out.json                 write a Perfetto/Chrome trace
  stagehost serve FILE [flags]         serve the manifest over HTTP
      --addr 127.0.0.1:8080            listen address
      --grace 30s                      how long SIGTERM waits for accepted requests
  stagehost trace FILE                 summarise a saved trace

Exit codes: 0 ok, 1 a run failed, 2 bad usage or invalid manifest, 3 the host could not start.
`

func main() { os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr)) }

// Main runs the command line args and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitInvalid
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
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "stagehost: unknown command %q\n\n%s", args[0], usage)
	return exitInvalid
}

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	clients := flag.Int("clients", 64, "concurrent `clients`, one request at a time each")
	duration := flag.Duration("duration", 60*time.Second, "how long clients keep sending")
	maxReq := flag.Int("max-requests", 2_000_000, "stop sending after this many requests in all")
	timeout := flag.Duration("timeout", 30*time.Second, "per-request timeout")
	bin := flag.String("bin", "", "the stagehost `binary` (default: go build ./cmd/stagehost into a temp dir)")
	jsonOut := flag.String("json", "", "also write the report as JSON to this `file`")
	flag.Parse()
	repo, err := FindRepo(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, Config{Clients: *clients, Duration: *duration, MaxRequests: *maxReq, Timeout: *timeout,
		Repo: repo, Bin: *bin, Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(1)
	}
	fmt.Print(rep)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "load:", err)
			os.Exit(1)
		}
	}
	if err := rep.Check(); err != nil {
		fmt.Fprintln(os.Stderr, "load: FAILED:", err)
		os.Exit(1)
	}
}

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/stages"
)

// versionModule is one of the lattice's test stages that answer their
// version ("v1", "v2"): its path and sha256.
func versionModule(t *testing.T, n string) (string, string, []byte) {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("../../internal/lattice/testdata", "version"+n+".wasm"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, stages.SHA256(b), b
}

func versionManifest(t *testing.T, lattice string) string {
	t.Helper()
	path, sha, _ := versionModule(t, "1")
	src := fmt.Sprintf(`version = 1
[runtime]
cache_dir = "off"
%s
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[module]]
name = "ver"
path = %q
sha256 = %q
[[session]]
name = "ver"
stage = "ver"
device = "gpu0"
`, lattice, path, sha)
	file := filepath.Join(t.TempDir(), "ver.toml")
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// TestServeLatticeSwap runs two `stagehost serve` in one lattice, both
// with session ver at version 1: a module uploaded to the first and
// swapped there reaches the second (every call to it answers v2, its
// heartbeat shows the module); a host-only swap on the second shows in
// its heartbeat; restarted, the second runs the lattice's module again.
func TestServeLatticeSwap(t *testing.T) {
	port := freePort(t)
	_, v1, _ := versionModule(t, "1")
	_, v2, bin2 := versionModule(t, "2")
	first := startServe(t, versionManifest(t, fmt.Sprintf(`[lattice]
name = "e2eswap"
host_id = "first"
embedded = true
listen = "127.0.0.1:%d"
store_dir = %q
`, port, t.TempDir())))
	secondManifest := versionManifest(t, fmt.Sprintf(`[lattice]
name = "e2eswap"
url = "nats://127.0.0.1:%d"
`, port))
	second := startServe(t, secondManifest, "--host-id", "second")
	pollFor(t, 10*time.Second, "both hosts listed", func() (bool, string) {
		b := string(first.request(nil, "GET", "/v1/lattice/hosts", nil).body)
		return strings.Contains(b, `"id": "second"`) && strings.Contains(b, `"id": "first"`), b
	})
	if a := first.request(nil, "PUT", "/v1/modules/ver?sha256="+v2, bytes.NewReader(bin2)); a.code != 201 {
		t.Fatalf("upload: %d %s", a.code, a.body)
	}
	a := first.request(nil, "POST", "/v1/sessions/ver/swap", strings.NewReader(`{"stage": "ver", "timeout": "20s"}`))
	var ans struct {
		SHA256   string `json:"sha256"`
		HostOnly bool   `json:"host_only"`
		Revision uint64 `json:"revision"`
		Hosts    []struct {
			ID           string `json:"id"`
			Acknowledged bool   `json:"acknowledged"`
		} `json:"hosts"`
	}
	if a.code != 200 || json.Unmarshal(a.body, &ans) != nil || ans.SHA256 != v2 || ans.HostOnly || len(ans.Hosts) != 2 || !ans.Hosts[0].Acknowledged || !ans.Hosts[1].Acknowledged {
		t.Fatalf("lattice-wide swap: %d %s", a.code, a.body)
	}
	for i := range 20 {
		if a := second.request(nil, "POST", "/v1/sessions/ver/run", strings.NewReader("x")); a.code != 200 || string(a.body) != "v2" {
			t.Fatalf("call %d to the second after the swap: %d %s", i, a.code, a.body)
		}
	}
	hosts := func(s *server) map[string]map[string]any {
		var h struct {
			Hosts []struct {
				ID       string           `json:"id"`
				Sessions []map[string]any `json:"sessions"`
			} `json:"hosts"`
		}
		if err := json.Unmarshal(s.request(nil, "GET", "/v1/lattice/hosts", nil).body, &h); err != nil {
			t.Fatal(err)
		}
		out := map[string]map[string]any{}
		for _, r := range h.Hosts {
			for _, sc := range r.Sessions {
				if sc["name"] == "ver" {
					out[r.ID] = sc
				}
			}
		}
		return out
	}
	for id, sc := range hosts(second) {
		if sc["stage_sha256"] != v2 {
			t.Fatalf("host %s's heartbeat after the swap: %v", id, sc)
		}
	}
	// Host only, on the second.
	if a := second.request(nil, "POST", "/v1/sessions/ver/swap", strings.NewReader(`{"stage": "ver@`+v1+`", "host_only": true}`)); a.code != 200 || !strings.Contains(string(a.body), `"host_only": true`) {
		t.Fatalf("host-only swap: %d %s", a.code, a.body)
	}
	pollFor(t, 5*time.Second, "the second's heartbeat shows its host-only swap", func() (bool, string) {
		sc := hosts(first)
		return sc["second"]["stage_sha256"] == v1 && sc["second"]["host_only"] == true && sc["first"]["stage_sha256"] == v2, fmt.Sprint(sc)
	})
	// Restarted, the second runs the lattice's module from its first
	// heartbeat.
	second.stop()
	second = startServe(t, secondManifest, "--host-id", "second")
	if a := second.request(nil, "POST", "/v1/sessions/ver/run", strings.NewReader("x")); a.code != 200 || string(a.body) != "v2" {
		t.Fatalf("the restarted second: %d %s", a.code, a.body)
	}
	pollFor(t, 5*time.Second, "the restarted second's heartbeat", func() (bool, string) {
		sc := hosts(first)["second"]
		return sc["stage_sha256"] == v2 && sc["host_only"] == nil, fmt.Sprint(sc)
	})
	second.stop()
	first.stop()
}

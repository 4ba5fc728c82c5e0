package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// residentSuperviseManifest is a sim gpu and npu pair with resident pp
// on them, and nothing else.
const residentSuperviseManifest = `version = 1
[runtime]
cache_dir = "off"
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[device]]
name = "npu0"
backend = "sim"
engine = "npu"
[[resident]]
name = "pp"
gpu = "gpu0"
npu = "npu0"
rounds = 8
join_deadline = "10s"
`

// TestServeSuperviseResident runs `serve --supervise` over a sim gpu and
// npu with a resident on them: the supervisor has no resident itself,
// so POST /v1/residents/pp/start goes through the lattice to gpu0's
// worker (202 with the run's id; 503 until that worker has joined), and
// GET /v1/residents/pp shows the run verified; a resident the manifest
// lacks is 404. SIGTERM stops it all, exit 0.
func TestServeSuperviseResident(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	path := filepath.Join(t.TempDir(), "resident.toml")
	if err := os.WriteFile(path, []byte(residentSuperviseManifest), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, path, "--supervise", "--host-id", "sv", "--quiet")
	do := func(method, path string) (int, string) {
		a := s.request(nil, method, path, nil)
		return a.code, string(a.body)
	}
	const limit = 20 * time.Second

	if code, body := do("GET", "/v1/residents/nope"); code != 404 || !strings.Contains(body, `"not_found"`) {
		t.Errorf("a resident the manifest lacks: %d %s", code, body)
	}
	// 503 until gpu0's worker has joined (the supervisor knows pp from
	// the manifest), then 202.
	var started struct {
		ID       int
		Resident string
		State    string
	}
	pollFor(t, limit, "a start of pp accepted", func() (bool, string) {
		code, body := do("POST", "/v1/residents/pp/start")
		if code == 503 && strings.Contains(body, `"unavailable"`) {
			return false, body
		}
		if code != 202 {
			t.Fatalf("start of pp: %d %s", code, body)
		}
		if err := json.Unmarshal([]byte(body), &started); err != nil || started.ID != 1 || started.Resident != "pp" || started.State != "running" ||
			!strings.Contains(body, "\n  \"id\": 1,\n") {
			t.Fatalf("start answer: %s (%v)", body, err)
		}
		return true, body
	})
	pollFor(t, limit, "pp's run 1 verified", func() (bool, string) {
		code, body := do("GET", "/v1/residents/pp")
		var st struct {
			Resident string
			Rounds   int
			Runs     []struct {
				ID       int
				State    string
				Verified bool
				Rounds   int
			}
		}
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil || st.Resident != "pp" || st.Rounds != 8 || len(st.Runs) != 1 {
			return false, body
		}
		r := st.Runs[0]
		if r.State == "failed" || r.State == "quarantined" {
			t.Fatalf("run 1: %s", body)
		}
		return r.ID == 1 && r.State == "verified" && r.Verified && r.Rounds == 8, body
	})
	if code, body := do("GET", "/v1/lattice/hosts"); code != 200 || !strings.Contains(body, `"id": "sv-gpu0"`) || !strings.Contains(body, `"gpu": "gpu0"`) {
		t.Errorf("/v1/lattice/hosts lacks gpu0's resident: %d %s", code, body)
	}

	if out, _ := s.stop(); !strings.Contains(out, "stopped: ") { // exit 0 after SIGTERM, or stop fails the test
		t.Errorf("stdout after SIGTERM:\n%s", out)
	}
}

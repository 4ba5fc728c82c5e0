package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
// worker (202 with the run's id and epoch; 503 until that worker has
// joined), and GET /v1/residents/pp shows the run verified; a resident
// the manifest lacks is 404. After a SIGKILL of that worker its
// successor has a new epoch and no runs, and its run ids start at 1
// again. SIGTERM stops it all, exit 0.
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
		Epoch    string
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
		if err := json.Unmarshal([]byte(body), &started); err != nil || started.Epoch == "" || started.ID != 1 || started.Resident != "pp" || started.State != "running" ||
			!strings.Contains(body, "\n  \"id\": 1,\n") {
			t.Fatalf("start answer: %s (%v)", body, err)
		}
		return true, body
	})
	pollFor(t, limit, "pp's run 1 verified", func() (bool, string) {
		code, body := do("GET", "/v1/residents/pp")
		var st struct {
			Epoch    string
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
		if st.Epoch != started.Epoch {
			t.Fatalf("status epoch %q, the start's %q: %s", st.Epoch, started.Epoch, body)
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

	// A new worker has a new epoch and none of the old runs.
	var ws struct {
		Workers []struct {
			Name string
			PID  int
		}
	}
	if code, body := do("GET", "/v1/workers"); code != 200 || json.Unmarshal([]byte(body), &ws) != nil || len(ws.Workers) != 2 || ws.Workers[0].Name != "gpu0" || ws.Workers[0].PID == 0 {
		t.Fatalf("/v1/workers: %d %s", code, body)
	}
	if err := syscall.Kill(ws.Workers[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	pollFor(t, limit, "pp on a new epoch, with no runs", func() (bool, string) {
		code, body := do("GET", "/v1/residents/pp")
		var st struct {
			Epoch string
			Runs  []struct{ ID int }
		}
		if code != 200 || json.Unmarshal([]byte(body), &st) != nil || st.Epoch == started.Epoch {
			return false, body
		}
		if len(st.Runs) != 0 {
			t.Fatalf("the new worker's pp has runs: %s", body)
		}
		return true, body
	})
	old := started.Epoch
	if code, body := do("POST", "/v1/residents/pp/start"); code != 202 || json.Unmarshal([]byte(body), &started) != nil || started.ID != 1 || started.Epoch == old {
		t.Fatalf("a start on the new worker: %d %s", code, body)
	}

	if out, _ := s.stop(); !strings.Contains(out, "stopped: ") { // exit 0 after SIGTERM, or stop fails the test
		t.Errorf("stdout after SIGTERM:\n%s", out)
	}
}

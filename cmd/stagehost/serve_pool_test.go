package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestServePool: the real binary serves a session pooled over two
// devices with a queue of one call. Eight calls at once (each takes
// about 300ms of device time): the two instances take one each, one
// waits for the first to finish, and the rest are refused at once with
// 429 busy and Retry-After; the session's status lists its instances and
// counts the same outcomes the clients saw.
func TestServePool(t *testing.T) {
	s := startServe(t, "testdata/pool.toml")
	c := &http.Client{Timeout: 30 * time.Second}
	const calls = 8
	answers := make([]answer, calls)
	took := make([]time.Duration, calls)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			req, _ := http.NewRequest("POST", s.base+"/v1/sessions/pooled/run", strings.NewReader("x"))
			resp, err := c.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Error(err)
				return
			}
			answers[i] = answer{resp.StatusCode, resp.Header, body}
			took[i] = time.Since(t0)
		}()
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		return
	}
	ok, busy := 0, 0
	for i, a := range answers {
		switch a.code {
		case 200:
			ok++
			if string(a.body) != "ok" {
				t.Errorf("call %d: 200 with %q", i, a.body)
			}
		case 429:
			busy++
			if e := a.errBody(t); e.Class != "busy" || a.header.Get("Retry-After") == "" || !strings.Contains(e.Error, "queue full") {
				t.Errorf("call %d: 429 %v %s", i, a.header, a.body)
			}
			if took[i] > 250*time.Millisecond {
				t.Errorf("call %d: refused after %v, not at once", i, took[i])
			}
		default:
			t.Errorf("call %d: %d %s", i, a.code, a.body)
		}
	}
	// Two instances and one queued call: at least three served. The
	// calls arrive within a few ms of one another, far less than a call's
	// 300ms, so at least one finds the queue full.
	if ok < 3 || busy < 1 || ok+busy != calls {
		t.Errorf("%d served, %d refused busy, of %d", ok, busy, calls)
	}
	// Once the queue has drained, a call is served.
	if a := s.request(c, "POST", "/v1/sessions/pooled/run", strings.NewReader("x")); a.code != 200 {
		t.Errorf("after the burst: %d %s", a.code, a.body)
	}
	ok++

	a := s.request(c, "GET", "/v1/sessions/pooled", nil)
	var st struct {
		State     string
		Calls     uint64
		Outcomes  map[string]uint64
		Instances []struct {
			Index  int
			Device string
			State  string
		}
	}
	if err := json.Unmarshal(a.body, &st); err != nil || a.code != 200 {
		t.Fatalf("%d %s: %v", a.code, a.body, err)
	}
	if st.State != "ready" || len(st.Instances) != 2 ||
		st.Instances[0].Device != "gpu0" || st.Instances[1].Device != "gpu1" ||
		st.Instances[0].State != "ready" || st.Instances[1].State != "ready" {
		t.Errorf("status: %s", a.body)
	}
	if st.Outcomes["ok"] != uint64(ok) || st.Outcomes["busy"] != uint64(busy) || st.Calls != uint64(ok+busy) {
		t.Errorf("the server counts %v (%d calls); the clients saw %d ok, %d busy", st.Outcomes, st.Calls, ok, busy)
	}
	s.stop()
}

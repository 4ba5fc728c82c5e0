package wasm_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/stagehost/stagehost/deploy"
	"github.com/stagehost/stagehost/examples/wasm/mlp/model"
	"github.com/stagehost/stagehost/internal/testutil"
	"github.com/stagehost/stagehost/manifest"
	"github.com/stagehost/stagehost/service"
)

// TestProductionManifestWithGoGuests: examples/production.toml, which
// README.md shows whole, is valid and serves as its comments say: tokens
// from the environment, a pooled session, its limits.
func TestProductionManifestWithGoGuests(t *testing.T) {
	testutil.GoGuests(t)
	src, err := os.ReadFile("../production.toml")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, []byte("```toml\n"+string(src)+"```\n")) {
		t.Error("README.md does not show examples/production.toml as it is, in a toml block")
	}
	m, err := manifest.Load("../production.toml")
	if err != nil {
		t.Fatal(err)
	}
	s := m.Session("classify")
	if s == nil || len(s.Devices) != 2 || s.Instances != 4 || s.QueueLimit != 64 || m.Service.AdminTokenEnv == "" || m.Service.InvokeTokenEnv == "" {
		t.Fatalf("manifest: %+v %+v", s, m.Service)
	}

	const admin, invoke = "admin-token-0123456789", "invoke-token-0123456789"
	t.Setenv(m.Service.AdminTokenEnv, admin)
	t.Setenv(m.Service.InvokeTokenEnv, invoke)
	m.Runtime.CacheDir = cacheDir // the test binary's: the Go guests compile once
	d, err := deploy.Open(context.Background(), m, deploy.NewConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close(context.Background()) })
	cfg := service.ConfigFromManifest(m)
	if cfg.AdminTokens, err = deploy.ReadTokens(m.Service.AdminTokenFile, m.Service.AdminTokenEnv); err != nil {
		t.Fatal(err)
	}
	if cfg.InvokeTokens, err = deploy.ReadTokens(m.Service.InvokeTokenFile, m.Service.InvokeTokenEnv); err != nil {
		t.Fatal(err)
	}
	h := service.NewServerConfig(d, nil, cfg).Handler()
	do := func(token string, body []byte) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v1/sessions/classify/run", bytes.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	in := model.TestInputs(1)[0]
	body := model.EncodeInput(in)
	want, _ := model.Predict(body)
	if rec := do("", body); rec.Code != http.StatusUnauthorized {
		t.Fatalf("no token: %d %s", rec.Code, rec.Body)
	}
	for range 8 { // twice round the pool, every call from the snapshot
		rec := do(invoke, body)
		if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), want) {
			t.Fatalf("invoke: %d % x, want % x", rec.Code, rec.Body.Bytes(), want)
		}
	}
	if rec := do(invoke, make([]byte, 5<<10)); rec.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("over max_input: %d %s", rec.Code, rec.Body)
	}
	st := d.Pool("classify").Status()
	if len(st.Instances) != 4 || st.Outcomes["ok"] != 8 || !strings.HasPrefix(st.Instances[1].Device, "gpu1") {
		t.Fatalf("status %+v", st)
	}
}

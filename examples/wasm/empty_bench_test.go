package wasm_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stagehost/stagehost/stages"
)

// BenchmarkEmptyStages is one call of an empty stage in each guest
// language through the whole host path on the sim backend (lane, deadline,
// built-in fence over one idle stream, idle check, trace): the cost of a
// language's SDK and runtime around a stage that does nothing.
//
//   - wat: stages/testdata/bench/empty.wasm, an export that returns 0;
//   - c: STAGEHOST_EXPORT("stagehost_run") returning 0 (stagehost.h),
//     built here with clang;
//   - rust: a stage! of a function returning Ok(()) (guest-sdk/rust),
//     built here with Debian's rustc and cargo, offline;
//   - go: examples/wasm/minimal (the Go SDK's Main; it writes "ok:").
//
// The c and rust cases skip without their toolchain.
func BenchmarkEmptyStages(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	dir := b.TempDir()
	mods := []struct {
		name, path string
		cfg        stages.LoadConfig
		build      func() error
	}{
		{"wat", "../../stages/testdata/bench/empty.wasm", stages.NewLoadConfig(), nil},
		{"c", filepath.Join(dir, "empty_c.wasm"), stages.NewLoadConfig(), func() error {
			src := filepath.Join(dir, "empty.c")
			if err := os.WriteFile(src, []byte("#include \"stagehost.h\"\nSTAGEHOST_ABI_V1();\nSTAGEHOST_EXPORT(\"stagehost_run\") int32_t run(void) { return 0; }\n"), 0o644); err != nil {
				return err
			}
			return exec.Command("clang", "--target=wasm32", "-O2", "-nostdlib", "-I../../guest-sdk/c", "-Wl,--no-entry", "-o", filepath.Join(dir, "empty_c.wasm"), src).Run()
		}},
		{"rust", filepath.Join(dir, "target", "wasm32-unknown-unknown", "release", "empty.wasm"), stages.NewLoadConfig(), func() error {
			sdk, err := filepath.Abs("../../guest-sdk/rust")
			if err != nil {
				return err
			}
			cargo := "[package]\nname = \"empty\"\nversion = \"0.1.0\"\nedition = \"2021\"\n[lib]\ncrate-type = [\"cdylib\"]\n" +
				"[dependencies]\nstagehost = { path = \"" + sdk + "\", features = [\"std\"] }\n" +
				"[profile.release]\nopt-level = \"s\"\nlto = true\npanic = \"abort\"\ncodegen-units = 1\nstrip = true\n"
			if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(dir, "Cargo.toml"), []byte(cargo), 0o644); err != nil {
				return err
			}
			lib := "fn run() -> stagehost::Result<()> {\n    Ok(())\n}\nstagehost::stage!(run);\n"
			if err := os.WriteFile(filepath.Join(dir, "src", "lib.rs"), []byte(lib), 0o644); err != nil {
				return err
			}
			cmd := exec.Command("/usr/bin/cargo", "build", "--offline", "--quiet", "--release", "--target", "wasm32-unknown-unknown")
			cmd.Dir, cmd.Env = dir, append(os.Environ(), "RUSTC=/usr/bin/rustc")
			out, err := cmd.CombinedOutput()
			if err != nil {
				b.Logf("cargo: %s", out)
			}
			return err
		}},
		{"go", "minimal/minimal.wasm", goGuest(), nil},
	}
	for _, m := range mods {
		b.Run(m.name, func(b *testing.B) {
			if m.build != nil {
				if err := m.build(); err != nil {
					b.Skipf("building the empty %s stage: %v", m.name, err)
				}
			}
			mod := load(b, m.path, "empty-"+m.name, m.cfg)
			s, err := engine(b).NewSession(ctx, f.rt, mod, stages.NewSessionConfig("empty-"+m.name, f.gpu).WithStreams("s0"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close(ctx)
			var out []byte
			b.ReportAllocs()
			for b.Loop() {
				if out, err = s.Run(ctx, nil, out[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

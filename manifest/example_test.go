package manifest_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/stagehost/stagehost/manifest"
)

func ExampleDecode() {
	src := []byte(`
version = 1

[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"

[[module]]
name = "mlp"
path = "modules/good_stage.wasm"   # relative to the manifest's directory
sha256 = "376dd78101d7619e264b9b86af6604dd324cf0357b7bcc497f5d888c52a22f2b"

[[session]]
name = "classify"
stage = "mlp"
device = "gpu0"
programs = ["noop"]
budget = "4MiB"
[[session.buffer]]
name = "weights"
size = "4KiB"
`)
	// The name places the manifest in testdata/, so the module is read
	// from testdata/modules/good_stage.wasm.
	m, err := manifest.Decode("testdata/example.toml", src, manifest.ReadFile)
	if err != nil {
		fmt.Println(err)
		return
	}
	s := m.Session("classify")
	mod := m.Module(s.Stage)
	fmt.Println(s.Name, "runs", mod.Name, "on", s.Device, "with fence", s.Fence)
	fmt.Println("streams", s.Streams, "programs", s.Programs)
	fmt.Println("budget", manifest.FormatSize(s.Budget), "deadline", s.Deadline, "fence timeout", s.FenceTimeout)
	fmt.Println("module", mod.File, len(mod.Bytes), "bytes, memory limit", manifest.FormatSize(mod.MemoryLimit))
	// Output:
	// classify runs mlp on gpu0 with fence builtin
	// streams [s0] programs [noop]
	// budget 4MiB deadline 5s fence timeout 10s
	// module testdata/modules/good_stage.wasm 570 bytes, memory limit 64MiB
}

// Every problem is reported at once, one line each, sorted by line.
func ExampleDecode_errors() {
	src := []byte(`version = 1

[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"

[[session]]
name = "classify"
stage = "mlp"
device = "gpu1"
budget = "64mb"
dedline = "5s"
`)
	noFiles := func(string, int64) ([]byte, error) { return nil, os.ErrNotExist }
	_, err := manifest.Decode("host.toml", src, noFiles)
	fmt.Println(err)
	// Output:
	// host.toml:10: session[0].stage: no module is named "mlp" (there is no [[module]])
	// host.toml:11: session[0].device: no device is named "gpu1" (did you mean "gpu0"?)
	// host.toml:12: session[0].budget: unknown size unit "mb" in "64mb" (use B, KB, MB, GB, KiB, MiB or GiB)
	// host.toml:13: session[0].dedline: unknown key (did you mean "deadline"?)
}

func ExampleLoad() {
	m, err := manifest.Load("testdata/good.toml")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range m.Sessions {
		fmt.Printf("session %s: stage %s, fence %s, device %s\n", s.Name, s.Stage, s.Fence, s.Device)
	}
	for _, r := range m.Residents {
		fmt.Printf("resident %s: gpu %s, npu %s, %d rounds\n", r.Name, r.GPU, r.NPU, r.Rounds)
	}
	// Output:
	// session minimal: stage stage, fence builtin, device gpu0
	// session full: stage go_stage, fence fence, device npu0
	// session drained: stage stage, fence drain, device cuda1
	// session pooled: stage stage, fence builtin, device gpu0
	// resident pingpong: gpu gpu0, npu npu0, 16 rounds
	// resident on-cpu: gpu cuda1, npu host-cpu, 1000000 rounds
}

func ExampleParseSize() {
	for _, s := range []string{"512B", "4KiB", "1MB", "1.5MiB"} {
		n, err := manifest.ParseSize(s)
		fmt.Println(n, err)
	}
	// Output:
	// 512 <nil>
	// 4096 <nil>
	// 1000000 <nil>
	// 0 a size must be a whole number of bytes, got "1.5MiB" (write 1536KiB, not 1.5MiB)
}

// ExampleLoadWith loads a manifest for a deployment that opens at once:
// its weights are hashed by the upload only, so the load reads just
// their size and header.
func ExampleLoadWith() {
	dir, _ := os.MkdirTemp("", "manifest-example-*")
	defer os.RemoveAll(dir)
	weights, _ := filepath.Abs("testdata/weights/tiny.safetensors")
	src := fmt.Sprintf(`version = 1
[[device]]
name = "gpu0"
backend = "sim"
engine = "gpu"
[[weights]]
name = "digits"
path = %q
sha256 = "f6b869dc7189a64b15672fe534ce31573ba9fe8a12e218b99215c921dca39a7a"
`, weights)
	path := filepath.Join(dir, "host.toml")
	_ = os.WriteFile(path, []byte(src), 0o644)
	m, err := manifest.LoadWith(path, manifest.NewLoadConfig().WithWeightsHashAtUpload(true))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, w := range m.Weights {
		fmt.Println(w.Name, w.DataSize, "bytes,", len(w.Tensors), "tensors, hashed at load:", w.HashedAtLoad)
	}
	// Output:
	// digits 24 bytes, 2 tensors, hashed at load: false
}

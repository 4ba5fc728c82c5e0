//go:build !linux

package stages

import "context"

// withKernelMemory returns ctx: off Linux a vendor kernel's memory is
// wazero's own, Go memory that the Go runtime frees after the launch
// (see the Linux kernelMemory).
func withKernelMemory(ctx context.Context) context.Context { return ctx }

// Package stagehost is the Go guest SDK for stagehost ABI v1 (abi/ABI.md in
// the host repository): an idiomatic API over the host functions of module
// stagehost_v1 for stage modules built with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o stage.wasm .
//
// A module registers its stage functions from init (Main, Register); the
// SDK's stagehost_run export reads the requested entry name, runs the
// function with a *Call, and turns a returned error into error_set plus a
// non-zero result (StatusOf). Panics are not recovered: they trap.
//
// The package exports the ABI marker stagehost_abi_v1 and stagehost_run,
// never stagehost_fence or stagehost_init (package fence provides the
// fence). On platforms other than wasip1 the same API talks to an
// in-process host, so stage logic can be unit-tested with package emu.
package stagehost

;; wasi_command: what a Go guest built without -buildmode=c-shared looks
;; like to the host: a WASI command, exporting _start (not _initialize)
;; and importing the Go runtime's WASI functions. The host never calls
;; _start, so the module is refused at load ("build it with GOOS=wasip1
;; GOARCH=wasm go build -buildmode=c-shared").
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "_start"))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

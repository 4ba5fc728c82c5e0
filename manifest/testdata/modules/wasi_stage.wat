;; wasi_stage: a stage that imports two WASI functions a Go guest uses
;; (fd_write, clock_time_get). Valid only with wasi = ["go-runtime"] or a
;; grant of both functions.
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

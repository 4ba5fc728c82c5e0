;; wasi_wrong_type: imports wasi_snapshot_preview1.fd_write, which the
;; go-runtime grant allows, but with the type (i32,i32)->(i32) instead of
;; WASI preview 1's (i32,i32,i32,i32)->(i32), and calls it. Refused at
;; load (InvalidArgument) with or without the grant; with the grant the
;; message names fd_write and both types.
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (call $fd_write (i32.const 1) (i32.const 0))))

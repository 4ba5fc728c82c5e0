;; wasi_fs: imports wasi_snapshot_preview1.path_open (its real WASI type)
;; and calls it. path_open is never grantable in v1: rejected at load
;; (InvalidArgument, naming path_open), whatever the WASI grant list.
(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "/etc/passwd") ;; 11 bytes
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    ;; fd 3 (first preopen), dirflags 0, path, oflags 0, rights read, fdflags 0, out fd at 64
    (call $path_open (i32.const 3) (i32.const 0) (i32.const 16) (i32.const 11)
                     (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 64))))

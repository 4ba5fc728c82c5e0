;; unsynced_submit: submits noop on s0 once (0 args) and returns 0
;; without syncing and without looking at the command's result. It has
;; no fence of its own. When the command fails on the device, the call
;; must fail with Fault whichever fence runs (built-in, fence_sync_status,
;; fence_sync_ok): failed device work never reaches the caller as success.
;;
;; Memory: 16 "s0", 32 "noop", 64 stream handle, 72 program handle,
;; 256.. setup-failure messages. Setup failures are client errors 100
;; (stream_get), 101 (program_get), 102 (stream_submit).
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $stream_submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "s0")
  (data (i32.const 32) "noop")
  (data (i32.const 256) "stream_get s0 failed")   ;; 20 bytes
  (data (i32.const 288) "program_get noop failed") ;; 23 bytes
  (data (i32.const 320) "stream_submit failed")    ;; 20 bytes
  (func $fail (param $code i32) (param $msg i32) (param $len i32) (result i32)
    (drop (call $error_set (local.get $msg) (local.get $len)))
    (local.get $code))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (if (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64))
      (then (return (call $fail (i32.const 100) (i32.const 256) (i32.const 20)))))
    (if (call $program_get (i32.const 32) (i32.const 4) (i32.const 72))
      (then (return (call $fail (i32.const 101) (i32.const 288) (i32.const 23)))))
    (if (call $stream_submit (i64.load (i32.const 64)) (i64.load (i32.const 72))
                             (i32.const 0) (i32.const 0))
      (then (return (call $fail (i32.const 102) (i32.const 320) (i32.const 20)))))
    (i32.const 0)))

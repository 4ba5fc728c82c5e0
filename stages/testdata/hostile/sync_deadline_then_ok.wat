;; sync_deadline_then_ok: submits noop on s0 (0 args), then calls
;; stream_sync(s0), writes the sync status to the output and returns 0,
;; whatever the status was. On a device whose commands take longer than
;; the stage's deadline, stream_sync returns DEADLINE_EXCEEDED (7) once the
;; deadline passed; the stage then returns 0, which must not turn into
;; success: the call fails with DeadlineExceeded.
;;
;; Memory: 16 "s0", 32 "noop", 64 stream handle, 72 program handle, 80
;; the sync status, 256.. setup-failure messages. Setup failures are
;; client errors 100 (stream_get), 101 (program_get), 102 (stream_submit),
;; 104 (output_write).
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $stream_submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "s0")
  (data (i32.const 32) "noop")
  (data (i32.const 256) "stream_get s0 failed")   ;; 20 bytes
  (data (i32.const 288) "program_get noop failed") ;; 23 bytes
  (data (i32.const 320) "stream_submit failed")    ;; 20 bytes
  (data (i32.const 384) "output_write failed")     ;; 19 bytes
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
    (i32.store (i32.const 80) (call $stream_sync (i64.load (i32.const 64))))
    (if (call $output_write (i32.const 80) (i32.const 4))
      (then (return (call $fail (i32.const 104) (i32.const 384) (i32.const 19)))))
    (i32.const 0)))

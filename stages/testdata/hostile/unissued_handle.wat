;; unissued_handle (extra case, complements forged_handle): looks up stream
;; "s0" to learn the session's own kind and tag, forges a handle with that
;; kind and tag but serial 0x7FFFFFFF (never issued), calls stream_sync on
;; it and writes the status as an i32 LE. Expected BAD_HANDLE (11).
;; Setup failure: client error 100.
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "s0")
  (data (i32.const 256) "stream_get s0 failed") ;; 20 bytes
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (if (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64))
      (then
        (drop (call $error_set (i32.const 256) (i32.const 20)))
        (return (i32.const 100))))
    (i32.store (i32.const 128)
      (call $stream_sync
        (i64.or (i64.and (i64.load (i32.const 64)) (i64.const 0xFFFFFFFF00000000))
                (i64.const 0x7FFFFFFF))))
    (drop (call $output_write (i32.const 128) (i32.const 4)))
    (i32.const 0)))

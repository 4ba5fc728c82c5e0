;; wrong_kind_handle: looks up stream "s0", then calls buffer_size on that
;; stream handle and writes the status as an i32 LE. Expected BAD_HANDLE
;; (11). Setup failure: client error 100.
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_size" (func $buffer_size (param i64 i32) (result i32)))
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
    (i32.store (i32.const 128) (call $buffer_size (i64.load (i32.const 64)) (i32.const 80)))
    (drop (call $output_write (i32.const 128) (i32.const 4)))
    (i32.const 0)))

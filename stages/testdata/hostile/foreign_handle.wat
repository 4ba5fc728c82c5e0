;; foreign_handle: reads an i64 LE handle from the first 8 bytes of its
;; input, calls stream_sync on it and writes the status as an i32 LE. The
;; test passes a stream handle of another session: expected FOREIGN_HANDLE
;; (13). Client error 100 if input_read fails or yields fewer than 8 bytes.
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 256) "need an 8-byte handle as input") ;; 30 bytes
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (if (i32.or (call $input_read (i32.const 0) (i32.const 64) (i32.const 8) (i32.const 80))
                (i32.ne (i32.load (i32.const 80)) (i32.const 8)))
      (then
        (drop (call $error_set (i32.const 256) (i32.const 30)))
        (return (i32.const 100))))
    (i32.store (i32.const 128) (call $stream_sync (i64.load (i32.const 64))))
    (drop (call $output_write (i32.const 128) (i32.const 4)))
    (i32.const 0)))

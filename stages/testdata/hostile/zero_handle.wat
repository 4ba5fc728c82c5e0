;; zero_handle: stream_sync(0), writes the status as an i32 LE. Expected
;; BAD_HANDLE (11).
(module
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.store (i32.const 128) (call $stream_sync (i64.const 0)))
    (drop (call $output_write (i32.const 128) (i32.const 4)))
    (i32.const 0)))

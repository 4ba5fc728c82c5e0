;; forged_handle: calls stream_sync on the forged handle 0x0100000000000007
;; (kind 1 stream, tag 0, serial 7) and writes the returned status to the
;; output as an i32 LE (4 bytes). Returns 0. The tag 0 never matches the
;; session's tag; see README.md for the expected status.
(module
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.store (i32.const 128) (call $stream_sync (i64.const 0x0100000000000007)))
    (drop (call $output_write (i32.const 128) (i32.const 4)))
    (i32.const 0)))

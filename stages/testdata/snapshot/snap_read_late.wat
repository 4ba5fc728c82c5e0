;; snap_read_late: reads buffer "b0" (64 bytes) of stream "s0" into its
;; memory at 4096 with stream_read, then traps whatever the status was.
;; On a device slower than the stage's deadline the read is still in
;; flight when the instance is discarded: it lands in the discarded
;; instance's memory while the fence drains the stream, so that memory
;; must outlive the instance until the fence has proven the stream idle.
;;
;; Memory: 16 "s0", 32 "b0", 64 stream handle, 72 buffer handle.
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_get" (func $buffer_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_read" (func $stream_read (param i64 i64 i32 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "s0")
  (data (i32.const 32) "b0")
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (drop (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64)))
    (drop (call $buffer_get (i32.const 32) (i32.const 2) (i32.const 72)))
    (drop (call $stream_read (i64.load (i32.const 64)) (i64.load (i32.const 72))
                             (i32.const 0) (i32.const 4096) (i32.const 64)))
    (unreachable)))

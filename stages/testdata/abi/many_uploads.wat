;; many_uploads: 16 uploads of 64 KiB, each filled with its index, into the
;; declared 1 MiB buffer "big" at offset i*64KiB, without waiting between
;; them; then it reads back the first byte of each block and outputs the
;; 16 bytes (0, 1, ..., 15). With a staging limit below 1 MiB the host must
;; drain and reuse its staging memory between uploads without losing any.
;; A failing call returns client error 100 + the step.
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_get" (func $buffer_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_write" (func $write (param i64 i64 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_read" (func $read (param i64 i64 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 2 2)
  ;; 16 "s0", 32 "big", 64 stream handle, 72 buffer handle,
  ;; 256.. the 16 bytes read back, 65536.. the 64 KiB upload block
  (data (i32.const 16) "s0")
  (data (i32.const 32) "big")
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $i i32)
    (if (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64)) (then (return (i32.const 100))))
    (if (call $buffer_get (i32.const 32) (i32.const 3) (i32.const 72)) (then (return (i32.const 101))))
    (loop $up
      (memory.fill (i32.const 65536) (local.get $i) (i32.const 65536))
      (if (call $write (i64.load (i32.const 64)) (i64.load (i32.const 72))
                       (i32.mul (local.get $i) (i32.const 65536)) (i32.const 65536) (i32.const 65536))
        (then (return (i32.const 102))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $up (i32.lt_u (local.get $i) (i32.const 16))))
    (local.set $i (i32.const 0))
    (loop $down
      (if (call $read (i64.load (i32.const 64)) (i64.load (i32.const 72))
                      (i32.mul (local.get $i) (i32.const 65536)) (i32.add (i32.const 256) (local.get $i)) (i32.const 1))
        (then (return (i32.const 103))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $down (i32.lt_u (local.get $i) (i32.const 16))))
    (if (call $output_write (i32.const 256) (i32.const 16)) (then (return (i32.const 104))))
    (i32.const 0)))

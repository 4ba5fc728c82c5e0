;; weights: looks up weights and tensors (ABI revision 3) and tries what
;; a read-only handle allows and refuses. The input is one op byte, then
;; a name (weights, or "<weights>/<tensor>"). The output is little-endian
;; u32 statuses and values, per op:
;;   0 weights_get: status, the handle (u64)
;;   1 tensor_get: status, the 96-byte record
;;   2 stream_write of 8 bytes into the weights: status, last error
;;   3 buffer_free of the weights: status, last error
;;   4 copy with the weights as dst (out): stream_submit status, last error
;;   5 copy of the weights' first 8 bytes into a buffer: submit status,
;;     sync status, stream_read status, the 8 bytes
;;   6 buffer_size: status, the size
;;   7 stream_read of the weights' first 8 bytes: status, the bytes
;;   8 a batch of two copies, the second with the weights as dst:
;;     stream_submit_batch status, last error, stream_idle status and value
;;   9 traps (unreachable), after weights_get
;; "last error" is last_error's status, length and message. A failing
;; setup step returns client error 100 + step.
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "last_error" (func $last_error (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_alloc" (func $buffer_alloc (param i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_free" (func $buffer_free (param i64) (result i32)))
  (import "stagehost_v1" "buffer_size" (func $buffer_size (param i64 i32) (result i32)))
  (import "stagehost_v1" "stream_write" (func $stream_write (param i64 i64 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_read" (func $stream_read (param i64 i64 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $stream_submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit_batch" (func $stream_submit_batch (param i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_idle" (func $stream_idle (param i64 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (import "stagehost_v1" "weights_get" (func $weights_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "tensor_get" (func $tensor_get (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  ;; 16: "s0", 32: "copy", 64: stream, 72: program, 80: buffer, 88:
  ;; weights (handles), 96: status word, 100: value, 120: input length,
  ;; 128: length word, 256: argument records, 512: tensor record, 768:
  ;; batch records, 2048:
  ;; input, 4096: message, 8192: data.
  (data (i32.const 16) "s0")
  (data (i32.const 32) "copy")
  (data (i32.const 8192) "ABCDEFGH")
  (func (export "stagehost_abi_v1"))
  (func $emit (param $status i32)
    (i32.store (i32.const 96) (local.get $status))
    (drop (call $output_write (i32.const 96) (i32.const 4))))
  (func $emit_error
    (call $emit (call $last_error (i32.const 4096) (i32.const 4096) (i32.const 128)))
    (drop (call $output_write (i32.const 128) (i32.const 4)))
    (drop (call $output_write (i32.const 4096) (i32.load (i32.const 128)))))
  (func $buffer_record (param $at i32) (param $handle i64)
    (i32.store (local.get $at) (i32.const 1))
    (i32.store offset=4 (local.get $at) (i32.const 0))
    (i32.store offset=8 (local.get $at) (i32.const 8))
    (i32.store offset=12 (local.get $at) (i32.const 0))
    (i64.store offset=16 (local.get $at) (local.get $handle)))
  (func (export "stagehost_run") (result i32)
    (local $op i32) (local $n i32)
    (if (call $input_read (i32.const 0) (i32.const 2048) (i32.const 1024) (i32.const 120)) (then (return (i32.const 101))))
    (local.set $n (i32.sub (i32.load (i32.const 120)) (i32.const 1)))
    (local.set $op (i32.load8_u (i32.const 2048)))
    (if (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64)) (then (return (i32.const 102))))
    (if (i32.eq (local.get $op) (i32.const 1))
      (then
        (call $emit (call $tensor_get (i32.const 2049) (local.get $n) (i32.const 512)))
        (if (i32.eqz (i32.load (i32.const 96)))
          (then (drop (call $output_write (i32.const 512) (i32.const 96)))))
        (return (i32.const 0))))
    (call $emit (call $weights_get (i32.const 2049) (local.get $n) (i32.const 88)))
    (if (i32.load (i32.const 96)) (then (return (i32.const 0))))
    (block $done
      (if (i32.eqz (local.get $op))
        (then (drop (call $output_write (i32.const 88) (i32.const 8))) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 9))
        (then unreachable))
      (if (i32.eq (local.get $op) (i32.const 2))
        (then
          (call $emit (call $stream_write (i64.load (i32.const 64)) (i64.load (i32.const 88)) (i32.const 0) (i32.const 8192) (i32.const 8)))
          (call $emit_error) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 3))
        (then
          (call $emit (call $buffer_free (i64.load (i32.const 88))))
          (call $emit_error) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 6))
        (then
          (call $emit (call $buffer_size (i64.load (i32.const 88)) (i32.const 100)))
          (drop (call $output_write (i32.const 100) (i32.const 4))) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 7))
        (then
          (call $emit (call $stream_read (i64.load (i32.const 64)) (i64.load (i32.const 88)) (i32.const 0) (i32.const 8192) (i32.const 8)))
          (drop (call $output_write (i32.const 8192) (i32.const 8))) (br $done)))
      (if (call $program_get (i32.const 32) (i32.const 4) (i32.const 72)) (then (return (i32.const 103))))
      (if (call $buffer_alloc (i32.const 8) (i32.const 80)) (then (return (i32.const 104))))
      (if (i32.eq (local.get $op) (i32.const 4))
        (then
          ;; copy(dst = the weights, src = the buffer)
          (call $buffer_record (i32.const 256) (i64.load (i32.const 88)))
          (call $buffer_record (i32.const 280) (i64.load (i32.const 80)))
          (call $emit (call $stream_submit (i64.load (i32.const 64)) (i64.load (i32.const 72)) (i32.const 256) (i32.const 2)))
          (call $emit_error) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 5))
        (then
          ;; copy(dst = the buffer, src = the weights)
          (call $buffer_record (i32.const 256) (i64.load (i32.const 80)))
          (call $buffer_record (i32.const 280) (i64.load (i32.const 88)))
          (call $emit (call $stream_submit (i64.load (i32.const 64)) (i64.load (i32.const 72)) (i32.const 256) (i32.const 2)))
          (call $emit (call $stream_sync (i64.load (i32.const 64))))
          (call $emit (call $stream_read (i64.load (i32.const 64)) (i64.load (i32.const 80)) (i32.const 0) (i32.const 8192) (i32.const 8)))
          (drop (call $output_write (i32.const 8192) (i32.const 8))) (br $done)))
      (if (i32.eq (local.get $op) (i32.const 8))
        (then
          ;; command 0: copy(dst = the buffer, src = the weights), fine;
          ;; command 1: copy(dst = the weights, src = the buffer), refused
          (call $buffer_record (i32.const 256) (i64.load (i32.const 80)))
          (call $buffer_record (i32.const 280) (i64.load (i32.const 88)))
          (call $buffer_record (i32.const 304) (i64.load (i32.const 88)))
          (call $buffer_record (i32.const 328) (i64.load (i32.const 80)))
          (i64.store (i32.const 768) (i64.load (i32.const 72)))
          (i32.store (i32.const 776) (i32.const 256))
          (i32.store (i32.const 780) (i32.const 2))
          (i64.store (i32.const 784) (i64.load (i32.const 72)))
          (i32.store (i32.const 792) (i32.const 304))
          (i32.store (i32.const 796) (i32.const 2))
          (call $emit (call $stream_submit_batch (i64.load (i32.const 64)) (i32.const 768) (i32.const 2)))
          (call $emit_error)
          (call $emit (call $stream_idle (i64.load (i32.const 64)) (i32.const 100)))
          (drop (call $output_write (i32.const 100) (i32.const 4))) (br $done)))
      (return (i32.const 199)))
    (i32.const 0)))

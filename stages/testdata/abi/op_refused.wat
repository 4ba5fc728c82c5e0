;; op_refused: launches an op of the device op library whose arguments do
;; not fit its contract, through the dotted program name "softmax.bf16":
;; x and y are a 16-byte buffer (8 bf16 values) and rows = cols = 3 (9
;; values). It writes to the output, as little-endian u32 values: the
;; stream_submit status (INVALID_ARGUMENT, at submit), the stream_idle
;; status and value (OK, 1: nothing was enqueued), the stream_sync status
;; (OK: no device failure to report), then last_error's status, length
;; and message. A failing setup step returns client error 100 + step.
(module
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "last_error" (func $last_error (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_alloc" (func $buffer_alloc (param i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $stream_submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_idle" (func $stream_idle (param i64 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (memory (export "memory") 1 1)
  ;; 16: "s0", 32: "softmax.bf16", 64: stream, 72: program, 80: buffer
  ;; (handles), 96: status word, 100: idle value, 128: length word,
  ;; 256: argument records, 1024: message.
  (data (i32.const 16) "s0")
  (data (i32.const 32) "softmax.bf16")
  (func (export "stagehost_abi_v1"))
  (func $emit (param $status i32)
    (i32.store (i32.const 96) (local.get $status))
    (drop (call $output_write (i32.const 96) (i32.const 4))))
  (func $buffer_record (param $at i32) (param $handle i64)
    (i32.store (local.get $at) (i32.const 1))
    (i32.store offset=4 (local.get $at) (i32.const 0))
    (i32.store offset=8 (local.get $at) (i32.const 0xFFFFFFFF))
    (i32.store offset=12 (local.get $at) (i32.const 0))
    (i64.store offset=16 (local.get $at) (local.get $handle)))
  (func $scalar_record (param $at i32) (param $v i64)
    (i32.store (local.get $at) (i32.const 0))
    (i64.store offset=4 (local.get $at) (i64.const 0))
    (i32.store offset=12 (local.get $at) (i32.const 0))
    (i64.store offset=16 (local.get $at) (local.get $v)))
  (func (export "stagehost_run") (result i32)
    (if (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64)) (then (return (i32.const 101))))
    (if (call $program_get (i32.const 32) (i32.const 12) (i32.const 72)) (then (return (i32.const 102))))
    (if (call $buffer_alloc (i32.const 16) (i32.const 80)) (then (return (i32.const 103))))
    ;; softmax.bf16(x, y, rows, cols, causal)
    (call $buffer_record (i32.const 256) (i64.load (i32.const 80)))
    (call $buffer_record (i32.const 280) (i64.load (i32.const 80)))
    (call $scalar_record (i32.const 304) (i64.const 3))
    (call $scalar_record (i32.const 328) (i64.const 3))
    (call $scalar_record (i32.const 352) (i64.const 0))
    (call $emit (call $stream_submit (i64.load (i32.const 64)) (i64.load (i32.const 72)) (i32.const 256) (i32.const 5)))
    (call $emit (call $stream_idle (i64.load (i32.const 64)) (i32.const 100)))
    (drop (call $output_write (i32.const 100) (i32.const 4)))
    (call $emit (call $stream_sync (i64.load (i32.const 64))))
    (call $emit (call $last_error (i32.const 1024) (i32.const 4096) (i32.const 128)))
    (drop (call $output_write (i32.const 128) (i32.const 4)))
    (drop (call $output_write (i32.const 1024) (i32.load (i32.const 128))))
    (i32.const 0)))

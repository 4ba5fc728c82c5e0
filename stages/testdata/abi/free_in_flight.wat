;; free_in_flight: allocates a 4096-byte buffer, submits the program
;; "noop" on stream "s0" with the buffer as its argument, frees the buffer
;; while that command may still be queued, submits "noop" once more
;; (without arguments, so a test can see from the stream's submission
;; count that the free has happened), and returns 0. The host must
;; keep the buffer (and its budget charge) until the fence has proven the
;; command retired (ABI.md §3, buffer_free).
;; A failing call returns client error 100 + the step.
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_alloc" (func $alloc (param i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_free" (func $free (param i64) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $submit (param i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 0) "s0")
  (data (i32.const 8) "noop")
  ;; 16: stream, 24: program, 32: buffer handle, 64: argument record
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (if (call $stream_get (i32.const 0) (i32.const 2) (i32.const 16)) (then (return (i32.const 100))))
    (if (call $program_get (i32.const 8) (i32.const 4) (i32.const 24)) (then (return (i32.const 101))))
    (if (call $alloc (i32.const 4096) (i32.const 32)) (then (return (i32.const 102))))
    ;; argument record: kind 1 (buffer), offset 0, length to the end, reserved 0, handle
    (i32.store (i32.const 64) (i32.const 1))
    (i32.store (i32.const 68) (i32.const 0))
    (i32.store (i32.const 72) (i32.const 0xFFFFFFFF))
    (i32.store (i32.const 76) (i32.const 0))
    (i64.store (i32.const 80) (i64.load (i32.const 32)))
    (if (call $submit (i64.load (i32.const 16)) (i64.load (i32.const 24)) (i32.const 64) (i32.const 1))
      (then (return (i32.const 103))))
    (if (call $free (i64.load (i32.const 32))) (then (return (i32.const 104))))
    (if (call $submit (i64.load (i32.const 16)) (i64.load (i32.const 24)) (i32.const 64) (i32.const 0))
      (then (return (i32.const 105))))
    (i32.const 0)))

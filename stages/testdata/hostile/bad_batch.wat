;; bad_batch: a batch whose second record names a forged program handle.
;; The host must validate every record before enqueuing any: the call
;; returns BAD_HANDLE (11) and the stream stays idle. Outputs two i32 LE:
;; the status of stream_submit_batch, then stream_idle's flag (1 = idle).
;;
;; Memory: 16 "s0", 32 "noop", 64 stream handle, 72 program handle,
;; 128.. two 16-byte batch records, 192 idle flag, 200 output.
;; A failing lookup is client error 100 (stream_get) or 101 (program_get).
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit_batch" (func $batch (param i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_idle" (func $idle (param i64 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "s0")
  (data (i32.const 32) "noop")
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (if (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64))
      (then (return (i32.const 100))))
    (if (call $program_get (i32.const 32) (i32.const 4) (i32.const 72))
      (then (return (i32.const 101))))
    ;; record 0: the real noop, no arguments
    (i64.store (i32.const 128) (i64.load (i32.const 72)))
    (i32.store (i32.const 136) (i32.const 0))
    (i32.store (i32.const 140) (i32.const 0))
    ;; record 1: the program handle with a serial never issued
    (i64.store (i32.const 144) (i64.or (i64.and (i64.load (i32.const 72)) (i64.const 0xFFFFFFFF00000000))
                                       (i64.const 0x7FFFFFFF)))
    (i32.store (i32.const 152) (i32.const 0))
    (i32.store (i32.const 156) (i32.const 0))
    (i32.store (i32.const 200) (call $batch (i64.load (i32.const 64)) (i32.const 128) (i32.const 2)))
    (drop (call $idle (i64.load (i32.const 64)) (i32.const 192)))
    (i32.store (i32.const 204) (i32.load (i32.const 192)))
    (drop (call $output_write (i32.const 200) (i32.const 8)))
    (i32.const 0)))

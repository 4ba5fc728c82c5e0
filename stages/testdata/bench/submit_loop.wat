;; Looks up stream "s0" and program "noop", then submits noop 256 times.
;; Measures one guest->host ABI call that enqueues device work.
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $submit (param i64 i64 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 0) "s0")
  (data (i32.const 8) "noop")
  ;; handles at 64 (stream) and 72 (program)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $i i32) (local $s i32)
    (if (call $stream_get (i32.const 0) (i32.const 2) (i32.const 64)) (then (return (i32.const 100))))
    (if (call $program_get (i32.const 8) (i32.const 4) (i32.const 72)) (then (return (i32.const 101))))
    (loop $l
      (local.set $s (call $submit (i64.load (i32.const 64)) (i64.load (i32.const 72)) (i32.const 0) (i32.const 0)))
      (if (local.get $s) (then (return (i32.add (i32.const 200) (local.get $s)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 256))))
    (i32.const 0)))

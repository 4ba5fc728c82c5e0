;; noop_launch.wat: the Wasm side of the noop-launch benchmark
;; (bench/cuda/wasmlaunch). Input: count (u32 LE), batch (u32 LE).
;;   batch 0: count stream_submit calls of program "noop" on stream "s0";
;;   batch k: count/k stream_submit_batch calls of k noop records each.
;; A BUSY answer (the stream's queue is full) is retried. Returns 0; 100+
;; for a set-up failure; 200+status (submit) or 300+status (batch).
;;
;; Rebuild: wat2wasm noop_launch.wat -o noop_launch.wasm
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit_batch" (func $submit_batch (param i64 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 0) "s0")
  (data (i32.const 8) "noop")
  ;; 16: input (count, batch); 24: bytes read; 64: stream; 72: program;
  ;; 1024: up to 1024 batch records of 16 bytes.
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $i i32) (local $s i32) (local $count i32) (local $batch i32)
    (local $stream i64) (local $prog i64)
    (if (call $input_read (i32.const 0) (i32.const 16) (i32.const 8) (i32.const 24)) (then (return (i32.const 100))))
    (if (i32.ne (i32.load (i32.const 24)) (i32.const 8)) (then (return (i32.const 101))))
    (local.set $count (i32.load (i32.const 16)))
    (local.set $batch (i32.load (i32.const 20)))
    (if (call $stream_get (i32.const 0) (i32.const 2) (i32.const 64)) (then (return (i32.const 102))))
    (if (call $program_get (i32.const 8) (i32.const 4) (i32.const 72)) (then (return (i32.const 103))))
    (local.set $stream (i64.load (i32.const 64)))
    (local.set $prog (i64.load (i32.const 72)))
    (if (i32.eqz (local.get $batch)) (then
      (block $done (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $count)))
        (local.set $s (call $submit (local.get $stream) (local.get $prog) (i32.const 0) (i32.const 0)))
        (br_if $l (i32.eq (local.get $s) (i32.const 1)))
        (if (local.get $s) (then (return (i32.add (i32.const 200) (local.get $s)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l)))
      (return (i32.const 0))))
    (if (i32.gt_u (local.get $batch) (i32.const 1024)) (then (return (i32.const 104))))
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $batch)))
      (i64.store (i32.add (i32.const 1024) (i32.shl (local.get $i) (i32.const 4))) (local.get $prog))
      (i64.store (i32.add (i32.const 1032) (i32.shl (local.get $i) (i32.const 4))) (i64.const 0))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (local.set $i (i32.const 0))
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $count)))
      (local.set $s (call $submit_batch (local.get $stream) (i32.const 1024) (local.get $batch)))
      (br_if $l (i32.eq (local.get $s) (i32.const 1)))
      (if (local.get $s) (then (return (i32.add (i32.const 300) (local.get $s)))))
      (local.set $i (i32.add (local.get $i) (local.get $batch)))
      (br $l)))
    (i32.const 0)))

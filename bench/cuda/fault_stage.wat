;; fault_stage.wat: a stage that makes its device fault on demand
;; (bench/cuda/supervise.sh). Input byte 0: 1 launches the CUDA program
;; "fault" (an illegal address: a sticky fault that loses the GPU for its
;; process), anything else launches "noop"; then it syncs the stream and
;; writes "ok". Returns 0; 100+ for a set-up failure; 200+status for a
;; failed submit, 300+status for a failed sync.
;;
;; Rebuild: wat2wasm fault_stage.wat -o fault_stage.wasm
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $sync (param i64) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 0) "s0")
  (data (i32.const 8) "noop")
  (data (i32.const 16) "fault")
  (data (i32.const 24) "ok")
  ;; 32: input byte; 36: bytes read; 64: stream; 72: program.
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $s i32) (local $stream i64)
    (i32.store8 (i32.const 32) (i32.const 0))
    (if (call $input_read (i32.const 0) (i32.const 32) (i32.const 1) (i32.const 36)) (then (return (i32.const 100))))
    (if (call $stream_get (i32.const 0) (i32.const 2) (i32.const 64)) (then (return (i32.const 101))))
    (local.set $stream (i64.load (i32.const 64)))
    (if (i32.eq (i32.load8_u (i32.const 32)) (i32.const 1))
      (then (if (call $program_get (i32.const 16) (i32.const 5) (i32.const 72)) (then (return (i32.const 102)))))
      (else (if (call $program_get (i32.const 8) (i32.const 4) (i32.const 72)) (then (return (i32.const 103))))))
    (local.set $s (call $submit (local.get $stream) (i64.load (i32.const 72)) (i32.const 0) (i32.const 0)))
    (if (local.get $s) (then (return (i32.add (i32.const 200) (local.get $s)))))
    (local.set $s (call $sync (local.get $stream)))
    (if (local.get $s) (then (return (i32.add (i32.const 300) (local.get $s)))))
    (drop (call $output_write (i32.const 24) (i32.const 2)))
    (i32.const 0)))

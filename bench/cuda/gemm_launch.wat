;; gemm_launch.wat: the Wasm side of the op library's gemm benchmark
;; (bench/cuda/wasmlaunch, BenchmarkWasmGemm). Input: n (u32 LE), reps
;; (u32 LE), value size in bytes (u32 LE: 4 for f32, 2 for f16/bf16), then
;; the program's name (gemm, gemm.fast, gemm.bf16.fast, ...). It takes
;; three n×n matrices from buffer_alloc_named ("A4", "B4", "C4" for 4-byte
;; values, "A2", ... for 2-byte ones: allocated at the first call, the same
;; live buffers afterwards), submits reps launches
;; of C = A·B (alpha 1, beta 0, batch 1) on stream "s0" and waits for them
;; with stream_sync. Returns 0; 100+ for a set-up failure; 200+status
;; (submit) or 300+status (sync).
;;
;; Rebuild: wat2wasm gemm_launch.wat -o gemm_launch.wasm
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_alloc_named" (func $alloc_named (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $sync (param i64) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 0) "s0")
  (data (i32.const 300) "A_B_C_")
  ;; 1024: input (n, reps, size, name...); 8: bytes read; 256: stream;
  ;; 264: program; 272, 280, 288: buffers A, B, C; 300: their names;
  ;; 512: 14 argument records of 24 bytes.
  (func $buf (param $i i32) (param $arg i32)
    ;; argument record $arg: buffer $i, the whole buffer
    (local $r i32)
    (local.set $r (i32.add (i32.const 512) (i32.mul (local.get $arg) (i32.const 24))))
    (i32.store (local.get $r) (i32.const 1))
    (i32.store offset=4 (local.get $r) (i32.const 0))
    (i32.store offset=8 (local.get $r) (i32.const -1))
    (i32.store offset=12 (local.get $r) (i32.const 0))
    (i64.store offset=16 (local.get $r) (i64.load (i32.add (i32.const 272) (i32.shl (local.get $i) (i32.const 3))))))
  (func $scalar (param $arg i32) (param $v i64)
    (local $r i32)
    (local.set $r (i32.add (i32.const 512) (i32.mul (local.get $arg) (i32.const 24))))
    (i64.store (local.get $r) (i64.const 0))
    (i64.store offset=8 (local.get $r) (i64.const 0))
    (i64.store offset=16 (local.get $r) (local.get $v)))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $i i32) (local $s i32) (local $n i32) (local $reps i32) (local $size i32) (local $got i32)
    (local $stream i64) (local $prog i64)
    (if (call $input_read (i32.const 0) (i32.const 1024) (i32.const 256) (i32.const 8)) (then (return (i32.const 100))))
    (local.set $got (i32.load (i32.const 8)))
    (if (i32.le_u (local.get $got) (i32.const 12)) (then (return (i32.const 101))))
    (local.set $n (i32.load (i32.const 1024)))
    (local.set $reps (i32.load (i32.const 1028)))
    (local.set $size (i32.mul (i32.mul (local.get $n) (local.get $n)) (i32.load (i32.const 1032))))
    ;; The names' second byte: the value size as a digit.
    (i32.store8 (i32.const 301) (i32.add (i32.const 48) (i32.load (i32.const 1032))))
    (i32.store8 (i32.const 303) (i32.add (i32.const 48) (i32.load (i32.const 1032))))
    (i32.store8 (i32.const 305) (i32.add (i32.const 48) (i32.load (i32.const 1032))))
    (if (call $stream_get (i32.const 0) (i32.const 2) (i32.const 256)) (then (return (i32.const 102))))
    (if (call $program_get (i32.const 1036) (i32.sub (local.get $got) (i32.const 12)) (i32.const 264)) (then (return (i32.const 103))))
    (local.set $stream (i64.load (i32.const 256)))
    (local.set $prog (i64.load (i32.const 264)))
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (i32.const 3)))
      (if (call $alloc_named (i32.add (i32.const 300) (i32.shl (local.get $i) (i32.const 1))) (i32.const 2) (local.get $size)
            (i32.add (i32.const 272) (i32.shl (local.get $i) (i32.const 3))))
        (then (return (i32.const 104))))
      (call $buf (local.get $i) (local.get $i))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (call $scalar (i32.const 3) (i64.extend_i32_u (local.get $n)))       ;; M
    (call $scalar (i32.const 4) (i64.extend_i32_u (local.get $n)))       ;; N
    (call $scalar (i32.const 5) (i64.extend_i32_u (local.get $n)))       ;; K
    (call $scalar (i32.const 6) (i64.const 0))                           ;; transA
    (call $scalar (i32.const 7) (i64.const 0))                           ;; transB
    (call $scalar (i32.const 8) (i64.const 0x3f800000))                  ;; alpha 1
    (call $scalar (i32.const 9) (i64.const 0))                           ;; beta 0
    (call $scalar (i32.const 10) (i64.const 1))                          ;; batch
    (call $scalar (i32.const 11) (i64.const 0))
    (call $scalar (i32.const 12) (i64.const 0))
    (call $scalar (i32.const 13) (i64.const 0))
    (local.set $i (i32.const 0))
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $reps)))
      (local.set $s (call $submit (local.get $stream) (local.get $prog) (i32.const 512) (i32.const 14)))
      (if (local.get $s) (then (return (i32.add (i32.const 200) (local.get $s)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (local.set $s (call $sync (local.get $stream)))
    (if (local.get $s) (then (return (i32.add (i32.const 300) (local.get $s)))))
    (i32.const 0)))

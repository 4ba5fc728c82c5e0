;; vendor_launch.wat: the Wasm side of the vendor-kernel launch benchmark
;; (bench/cuda/wasmlaunch/vendor_test.go, bench/cuda/vendor.sh). Input:
;; count (u32 LE), n (u32 LE). It launches the vendor kernel "double"
;; (x f32 in, y f32 out, n u32: testdata double.ptx) count times with
;; stream_launch on stream "s0" over buffers "x" and "y", grid
;; ((n+255)/256, 1, 1) and block (256, 1, 1), then syncs once. A BUSY
;; answer (the stream's queue is full) is retried. Returns 0; 100+ for a
;; set-up failure; 200+status (launch); 300+status (sync).
;;
;; Rebuild: wat2wasm vendor_launch.wat -o vendor_launch.wasm
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_get" (func $buffer_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_launch" (func $launch (param i64 i64 i32 i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $sync (param i64) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 0) "s0")
  (data (i32.const 8) "double")
  (data (i32.const 16) "x")
  (data (i32.const 20) "y")
  ;; 32: input (count, n); 40: bytes read; 64: stream; 72: program; 80:
  ;; x; 88: y; 128: grid; 144: block; 256: three argument records.
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $i i32) (local $s i32) (local $count i32) (local $stream i64) (local $prog i64)
    (if (call $input_read (i32.const 0) (i32.const 32) (i32.const 8) (i32.const 40)) (then (return (i32.const 100))))
    (local.set $count (i32.load (i32.const 32)))
    (if (call $stream_get (i32.const 0) (i32.const 2) (i32.const 64)) (then (return (i32.const 101))))
    (if (call $program_get (i32.const 8) (i32.const 6) (i32.const 72)) (then (return (i32.const 102))))
    (if (call $buffer_get (i32.const 16) (i32.const 1) (i32.const 80)) (then (return (i32.const 103))))
    (if (call $buffer_get (i32.const 20) (i32.const 1) (i32.const 88)) (then (return (i32.const 104))))
    (local.set $stream (i64.load (i32.const 64)))
    (local.set $prog (i64.load (i32.const 72)))
    ;; grid ((n+255)/256, 1, 1), block (256, 1, 1)
    (i32.store (i32.const 128) (i32.shr_u (i32.add (i32.load (i32.const 36)) (i32.const 255)) (i32.const 8)))
    (i32.store (i32.const 132) (i32.const 1))
    (i32.store (i32.const 136) (i32.const 1))
    (i32.store (i32.const 144) (i32.const 256))
    (i32.store (i32.const 148) (i32.const 1))
    (i32.store (i32.const 152) (i32.const 1))
    ;; x, y: whole buffers (kind 1, offset 0, length to the end); n: scalar
    (i32.store (i32.const 256) (i32.const 1))
    (i32.store (i32.const 264) (i32.const -1))
    (i64.store (i32.const 272) (i64.load (i32.const 80)))
    (i32.store (i32.const 280) (i32.const 1))
    (i32.store (i32.const 288) (i32.const -1))
    (i64.store (i32.const 296) (i64.load (i32.const 88)))
    (i64.store (i32.const 320) (i64.extend_i32_u (i32.load (i32.const 36))))
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $count)))
      (local.set $s (call $launch (local.get $stream) (local.get $prog) (i32.const 128) (i32.const 144) (i32.const 0) (i32.const 256) (i32.const 3)))
      (br_if $l (i32.eq (local.get $s) (i32.const 1)))
      (if (local.get $s) (then (return (i32.add (i32.const 200) (local.get $s)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))
    (local.set $s (call $sync (local.get $stream)))
    (if (local.get $s) (then (return (i32.add (i32.const 300) (local.get $s)))))
    (i32.const 0)))

;; snap_clock: reads the WASI clocks and random source in _initialize and
;; again in each call, and outputs every reading. A session made from a
;; snapshot must output exactly what a freshly initialised one does: its
;; clocks and random stream continue from where initialisation left them.
;;
;; Memory: 512 monotonic, 520 wall clock, 528 8 random bytes (from
;; _initialize); 536, 544, 552 the same from the call. Output: 512..560.
(module
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func $read (param $at i32)
    (drop (call $clock (i32.const 1) (i64.const 1) (local.get $at)))
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.add (local.get $at) (i32.const 8))))
    (drop (call $random (i32.add (local.get $at) (i32.const 16)) (i32.const 8))))
  (func (export "_initialize") (call $read (i32.const 512)))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (call $read (i32.const 536))
    (drop (call $output_write (i32.const 512) (i32.const 48)))
    (i32.const 0)))

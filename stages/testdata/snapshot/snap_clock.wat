;; snap_clock: reads the WASI clocks and random source in _initialize and
;; again in each call, and outputs every reading, so that tests can check
;; where they come from (ABI.md §4.3.1): the host's real clocks and its
;; CSPRNG, fresh for every instance and every call, whatever an earlier
;; call read.
;;
;; Input: an optional u32, n: the call reads the monotonic clock n more
;; times after its first readings (a call that reads it often).
;;
;; Memory, all little-endian:
;;   512 monotonic, 520 wall clock, 528..544 16 random bytes (_initialize);
;;   544 monotonic, 552 wall clock, 560..576 16 random bytes (the call's
;;   first readings); 576 the call's last monotonic reading.
;; Output: 512..584 (72 bytes).
(module
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func $read (param $at i32)
    (drop (call $clock (i32.const 1) (i64.const 1) (local.get $at)))
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.add (local.get $at) (i32.const 8))))
    (drop (call $random (i32.add (local.get $at) (i32.const 16)) (i32.const 16))))
  (func (export "_initialize") (call $read (i32.const 512)))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $n i32)
    (call $read (i32.const 544))
    (i64.store (i32.const 576) (i64.load (i32.const 544)))
    ;; n from the input (0 without one): 4 bytes at 600, the count at 604
    (i32.store (i32.const 600) (i32.const 0))
    (drop (call $input_read (i32.const 0) (i32.const 600) (i32.const 4) (i32.const 604)))
    (local.set $n (i32.load (i32.const 600)))
    (block $done
      (loop $more
        (br_if $done (i32.eqz (local.get $n)))
        (drop (call $clock (i32.const 1) (i64.const 1) (i32.const 576)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $more)))
    (drop (call $output_write (i32.const 512) (i32.const 72)))
    (i32.const 0)))

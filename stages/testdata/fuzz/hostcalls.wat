;; hostcalls: the replay guest of FuzzHostCalls (stages/fuzz_hostcalls_test.go).
;; Build: wat2wasm -o hostcalls.wasm hostcalls.wat
;;
;; Its input is a sequence of 44-byte records; a trailing partial record is
;; ignored. A record is
;;
;;   offset 0   u32  selector: the import called is number (selector mod 22)
;;                   in the list below
;;   offset 4   u64  argument 0
;;   offset 12  u64  argument 1
;;   offset 20  u64  argument 2
;;   offset 28  u64  argument 3
;;   offset 36  u64  argument 4
;;
;; all little-endian. The selected stagehost_v1 function is called with its
;; parameters taken in order from the arguments: an i64 parameter gets the
;; whole argument, an i32 parameter its low 32 bits, exactly as given
;; (pointers, lengths, sizes, offsets and handles are never checked or
;; adjusted here). Unused arguments are ignored.
;;
;;    0 input_size          5 log                 10 buffer_alloc_named  15 stream_submit
;;    1 input_read          6 stream_get          11 buffer_free         16 stream_submit_batch
;;    2 output_write        7 buffer_get          12 buffer_size         17 stream_sync
;;    3 entry_name          8 program_get         13 stream_write        18 stream_idle
;;    4 error_set           9 buffer_alloc        14 stream_read         19 last_error
;;   20 weights_get        21 tensor_get
;;
;; After each call the guest appends the call's i32 status to the output
;; (4 bytes, u32 LE), so the output is the concatenation, in record order,
;; of whatever output_write records appended and one status per record.
;; If appending a status fails (the output limit is reached) the guest
;; stops and returns 1. It returns 0 after the last record. 2 and 3 mean
;; input_size or input_read of a record failed, which never happens with a
;; correct host.
;;
;; Memory: one page, fixed (min 1, max 1). Names a record can point at:
;; 256 "s0", 264 "s1", 272 "b0", 280 "noop", 288 "fill", 296 "weights" (7
;; bytes), 304 "weights/w" (9 bytes). The guest's own scratch words are at the top of the page:
;; 65472 the current record (re-read before every call, so a call that
;; writes over it changes nothing), 65520 the status being appended, 65524
;; input_read's count, 65528 the input size. The loop's state is in locals,
;; out of reach of the host calls it makes.
(module
  (import "stagehost_v1" "input_size" (func $input_size (param i32) (result i32)))
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "entry_name" (func $entry_name (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (import "stagehost_v1" "log" (func $log (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_get" (func $buffer_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_alloc" (func $buffer_alloc (param i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_alloc_named" (func $buffer_alloc_named (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_free" (func $buffer_free (param i64) (result i32)))
  (import "stagehost_v1" "buffer_size" (func $buffer_size (param i64 i32) (result i32)))
  (import "stagehost_v1" "stream_write" (func $stream_write (param i64 i64 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_read" (func $stream_read (param i64 i64 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $stream_submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit_batch" (func $stream_submit_batch (param i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (import "stagehost_v1" "stream_idle" (func $stream_idle (param i64 i32) (result i32)))
  (import "stagehost_v1" "last_error" (func $last_error (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "weights_get" (func $weights_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "tensor_get" (func $tensor_get (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 256) "s0")
  (data (i32.const 264) "s1")
  (data (i32.const 272) "b0")
  (data (i32.const 280) "noop")
  (data (i32.const 288) "fill")
  (data (i32.const 296) "weights")
  (data (i32.const 304) "weights/w")
  (func (export "stagehost_abi_v1"))
  ;; $a64 k: argument k of the current record; $a32 k: its low 32 bits.
  (func $a64 (param $k i32) (result i64)
    (i64.load (i32.add (i32.const 65476) (i32.shl (local.get $k) (i32.const 3)))))
  (func $a32 (param $k i32) (result i32)
    (i32.wrap_i64 (call $a64 (local.get $k))))
  ;; $dispatch calls the import the current record selects and returns its status.
  (func $dispatch (result i32)
    (block $f21
    (block $f20
    (block $f19
    (block $f18
    (block $f17
    (block $f16
    (block $f15
    (block $f14
    (block $f13
    (block $f12
    (block $f11
    (block $f10
    (block $f9
    (block $f8
    (block $f7
    (block $f6
    (block $f5
    (block $f4
    (block $f3
    (block $f2
    (block $f1
    (block $f0
      (br_table $f0 $f1 $f2 $f3 $f4 $f5 $f6 $f7 $f8 $f9 $f10 $f11 $f12 $f13 $f14 $f15 $f16 $f17 $f18 $f19 $f20 $f21 $f0
        (i32.rem_u (i32.load (i32.const 65472)) (i32.const 22))))
    (return (call $input_size (call $a32 (i32.const 0)))))  ;; 0
    (return (call $input_read (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)) (call $a32 (i32.const 3)))))  ;; 1
    (return (call $output_write (call $a32 (i32.const 0)) (call $a32 (i32.const 1)))))  ;; 2
    (return (call $entry_name (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)))))  ;; 3
    (return (call $error_set (call $a32 (i32.const 0)) (call $a32 (i32.const 1)))))  ;; 4
    (return (call $log (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)))))  ;; 5
    (return (call $stream_get (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)))))  ;; 6
    (return (call $buffer_get (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)))))  ;; 7
    (return (call $program_get (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)))))  ;; 8
    (return (call $buffer_alloc (call $a32 (i32.const 0)) (call $a32 (i32.const 1)))))  ;; 9
    (return (call $buffer_alloc_named (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)) (call $a32 (i32.const 3)))))  ;; 10
    (return (call $buffer_free (call $a64 (i32.const 0)))))  ;; 11
    (return (call $buffer_size (call $a64 (i32.const 0)) (call $a32 (i32.const 1)))))  ;; 12
    (return (call $stream_write (call $a64 (i32.const 0)) (call $a64 (i32.const 1)) (call $a32 (i32.const 2)) (call $a32 (i32.const 3)) (call $a32 (i32.const 4)))))  ;; 13
    (return (call $stream_read (call $a64 (i32.const 0)) (call $a64 (i32.const 1)) (call $a32 (i32.const 2)) (call $a32 (i32.const 3)) (call $a32 (i32.const 4)))))  ;; 14
    (return (call $stream_submit (call $a64 (i32.const 0)) (call $a64 (i32.const 1)) (call $a32 (i32.const 2)) (call $a32 (i32.const 3)))))  ;; 15
    (return (call $stream_submit_batch (call $a64 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)))))  ;; 16
    (return (call $stream_sync (call $a64 (i32.const 0)))))  ;; 17
    (return (call $stream_idle (call $a64 (i32.const 0)) (call $a32 (i32.const 1)))))  ;; 18
    (return (call $last_error (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)))))  ;; 19
    (return (call $weights_get (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2)))))  ;; 20
    (return (call $tensor_get (call $a32 (i32.const 0)) (call $a32 (i32.const 1)) (call $a32 (i32.const 2))))  ;; 21
    (unreachable))
  (func (export "stagehost_run") (result i32)
    (local $n i32)
    (local $off i32)
    (if (call $input_size (i32.const 65528))
      (then (return (i32.const 2))))
    (local.set $n (i32.load (i32.const 65528)))
    (block $done
      (loop $next
        (br_if $done (i64.gt_u (i64.add (i64.extend_i32_u (local.get $off)) (i64.const 44))
                               (i64.extend_i32_u (local.get $n))))
        (if (call $input_read (local.get $off) (i32.const 65472) (i32.const 44) (i32.const 65524))
          (then (return (i32.const 3))))
        (i32.store (i32.const 65520) (call $dispatch))
        (if (call $output_write (i32.const 65520) (i32.const 4))
          (then (return (i32.const 1))))
        (local.set $off (i32.add (local.get $off) (i32.const 44)))
        (br $next)))
    (i32.const 0)))

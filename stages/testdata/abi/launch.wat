;; launch: launches the vendor kernel "double" (x f32 in, y f32 out,
;; n u32) with stream_launch (ABI revision 4). The input is the grid
;; (3 u32), the block (3 u32), shared_bytes (u32), a mode (u32) and x's
;; 16 bytes. Modes:
;;   0 stream_launch(double, x, y, 4)
;;   1 stream_submit(double, x, y, 4)
;;   2 stream_launch(double, x, y): one argument short
;;   3 stream_launch(fill, y, 4): a built-in program
;;   4 stream_launch(double, x, 7, 4): a scalar where a buffer is declared
;;   5 stream_launch(double, x, y, 4), then return 0 at once: no sync, no
;;     output; the fence drains the launch
;;   6 stream_launch(fill, y, 4) with grid_ptr 65530, past the memory's
;;     end (one page): a built-in program and a grid out of bounds
;;   7 stream_launch(double, x, y, 4) with block_ptr 0xFFFFFFF0
;;   8 stream_launch(double, x, y, 4) with args_ptr 65520: the records
;;     out of bounds
;;   9 stream_launch(double, ...) with 17 records at args_ptr 65520
;;  10 stream_launch(double, x, y[4,+16), 4): argument 1's range ends past
;;     y's 16 bytes
;; The output is the launch's status (u32), stream_sync's status (u32),
;; y's 16 bytes after stream_read, and the last error: last_error's
;; status, length and message. A failing setup step returns 100 + step.
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "last_error" (func $last_error (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_get" (func $buffer_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_write" (func $stream_write (param i64 i64 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_read" (func $stream_read (param i64 i64 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $stream_submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_launch" (func $stream_launch (param i64 i64 i32 i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (memory (export "memory") 1 1)
  ;; 0: "s0", 8: "double", 16: "x", 20: "y", 24: "fill"; handles at 64
  ;; (stream), 72 (double), 80 (x), 88 (y), 96 (fill); 120: input count;
  ;; 128: input (grid 128, block 140, shared 152, mode 156, x 160);
  ;; 256: argument records; 512: output; 1024: last error length, 1028:
  ;; message.
  (data (i32.const 0) "s0")
  (data (i32.const 8) "double")
  (data (i32.const 16) "x")
  (data (i32.const 20) "y")
  (data (i32.const 24) "fill")
  (func (export "stagehost_abi_v1"))
  (func $buf (param $rec i32) (param $h i32)
    (i32.store (local.get $rec) (i32.const 1))
    (i32.store offset=4 (local.get $rec) (i32.const 0))
    (i32.store offset=8 (local.get $rec) (i32.const -1))
    (i32.store offset=12 (local.get $rec) (i32.const 0))
    (i64.store offset=16 (local.get $rec) (i64.load (local.get $h))))
  (func $scalar (param $rec i32) (param $v i64)
    (i32.store (local.get $rec) (i32.const 0))
    (i32.store offset=4 (local.get $rec) (i32.const 0))
    (i32.store offset=8 (local.get $rec) (i32.const 0))
    (i32.store offset=12 (local.get $rec) (i32.const 0))
    (i64.store offset=16 (local.get $rec) (local.get $v)))
  (func (export "stagehost_run") (result i32)
    (local $mode i32) (local $st i32) (local $n i32)
    (if (call $input_read (i32.const 0) (i32.const 128) (i32.const 48) (i32.const 120)) (then (return (i32.const 101))))
    (if (call $stream_get (i32.const 0) (i32.const 2) (i32.const 64)) (then (return (i32.const 102))))
    (if (call $program_get (i32.const 8) (i32.const 6) (i32.const 72)) (then (return (i32.const 103))))
    (if (call $buffer_get (i32.const 16) (i32.const 1) (i32.const 80)) (then (return (i32.const 104))))
    (if (call $buffer_get (i32.const 20) (i32.const 1) (i32.const 88)) (then (return (i32.const 105))))
    (if (call $program_get (i32.const 24) (i32.const 4) (i32.const 96)) (then (return (i32.const 106))))
    (if (call $stream_write (i64.load (i32.const 64)) (i64.load (i32.const 80)) (i32.const 0) (i32.const 160) (i32.const 16)) (then (return (i32.const 107))))
    (local.set $mode (i32.load (i32.const 156)))
    (call $buf (i32.const 256) (i32.const 80))
    (call $buf (i32.const 280) (i32.const 88))
    (call $scalar (i32.const 304) (i64.const 4))
    (if (i32.eq (local.get $mode) (i32.const 0))
      (then (local.set $st (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 72))
        (i32.const 128) (i32.const 140) (i32.load (i32.const 152)) (i32.const 256) (i32.const 3)))))
    (if (i32.eq (local.get $mode) (i32.const 1))
      (then (local.set $st (call $stream_submit (i64.load (i32.const 64)) (i64.load (i32.const 72)) (i32.const 256) (i32.const 3)))))
    (if (i32.eq (local.get $mode) (i32.const 2))
      (then (local.set $st (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 72))
        (i32.const 128) (i32.const 140) (i32.load (i32.const 152)) (i32.const 256) (i32.const 2)))))
    (if (i32.eq (local.get $mode) (i32.const 3))
      (then
        (call $buf (i32.const 256) (i32.const 88))
        (call $scalar (i32.const 280) (i64.const 4))
        (local.set $st (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 96))
          (i32.const 128) (i32.const 140) (i32.load (i32.const 152)) (i32.const 256) (i32.const 2)))))
    (if (i32.eq (local.get $mode) (i32.const 4))
      (then
        (call $scalar (i32.const 280) (i64.const 7))
        (local.set $st (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 72))
          (i32.const 128) (i32.const 140) (i32.load (i32.const 152)) (i32.const 256) (i32.const 3)))))
    (if (i32.eq (local.get $mode) (i32.const 5))
      (then
        (drop (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 72))
          (i32.const 128) (i32.const 140) (i32.load (i32.const 152)) (i32.const 256) (i32.const 3)))
        (return (i32.const 0))))
    (if (i32.eq (local.get $mode) (i32.const 6))
      (then
        (call $buf (i32.const 256) (i32.const 88))
        (call $scalar (i32.const 280) (i64.const 4))
        (local.set $st (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 96))
          (i32.const 65530) (i32.const 140) (i32.load (i32.const 152)) (i32.const 256) (i32.const 2)))))
    (if (i32.eq (local.get $mode) (i32.const 7))
      (then (local.set $st (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 72))
        (i32.const 128) (i32.const -16) (i32.load (i32.const 152)) (i32.const 256) (i32.const 3)))))
    (if (i32.eq (local.get $mode) (i32.const 8))
      (then (local.set $st (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 72))
        (i32.const 128) (i32.const 140) (i32.load (i32.const 152)) (i32.const 65520) (i32.const 3)))))
    (if (i32.eq (local.get $mode) (i32.const 9))
      (then (local.set $st (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 72))
        (i32.const 128) (i32.const 140) (i32.load (i32.const 152)) (i32.const 65520) (i32.const 17)))))
    (if (i32.eq (local.get $mode) (i32.const 10))
      (then
        (i32.store offset=4 (i32.const 280) (i32.const 4))
        (i32.store offset=8 (i32.const 280) (i32.const 16))
        (local.set $st (call $stream_launch (i64.load (i32.const 64)) (i64.load (i32.const 72))
          (i32.const 128) (i32.const 140) (i32.load (i32.const 152)) (i32.const 256) (i32.const 3)))))
    (i32.store (i32.const 512) (local.get $st))
    (i32.store (i32.const 516) (call $stream_sync (i64.load (i32.const 64))))
    (if (call $stream_read (i64.load (i32.const 64)) (i64.load (i32.const 88)) (i32.const 0) (i32.const 520) (i32.const 16)) (then (return (i32.const 108))))
    (i32.store (i32.const 536) (call $last_error (i32.const 1028) (i32.const 512) (i32.const 1024)))
    (drop (call $output_write (i32.const 512) (i32.const 28)))
    (drop (call $output_write (i32.const 1024) (i32.add (i32.const 4) (i32.load (i32.const 1024)))))
    (i32.const 0)))

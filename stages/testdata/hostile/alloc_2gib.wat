;; alloc_2gib: calls buffer_alloc(0x80000000, &h), a size with the top bit
;; set, which ABI v1 reads as unsigned: 2 GiB, never a negative number.
;; Writes the status (u32 LE) to the output. If it is OK it also calls
;; buffer_size(h) and writes that status and the size (u32 LE each), then
;; buffer_free(h) and writes that status. Returns 0.
;;
;; Output: with a budget below 2 GiB, 4 bytes: 6 OUT_OF_BUDGET. With a
;; budget of at least 2 GiB, 16 bytes: 0, 0, 0x80000000, 0.
;;
;; Memory: 64 handle, 80 the word being written, 88 buffer_size's result.
(module
  (import "stagehost_v1" "buffer_alloc" (func $buffer_alloc (param i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_size" (func $buffer_size (param i64 i32) (result i32)))
  (import "stagehost_v1" "buffer_free" (func $buffer_free (param i64) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func $emit (param $v i32)
    (i32.store (i32.const 80) (local.get $v))
    (drop (call $output_write (i32.const 80) (i32.const 4))))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $st i32)
    (local.set $st (call $buffer_alloc (i32.const 0x80000000) (i32.const 64)))
    (call $emit (local.get $st))
    (if (local.get $st)
      (then (return (i32.const 0))))
    (call $emit (call $buffer_size (i64.load (i32.const 64)) (i32.const 88)))
    (call $emit (i32.load (i32.const 88)))
    (call $emit (call $buffer_free (i64.load (i32.const 64))))
    (i32.const 0)))

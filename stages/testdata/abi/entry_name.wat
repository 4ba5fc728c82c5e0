;; entry_name: exercises entry_name's out-parameter rules (ABI.md §3). It
;; writes to the output, in order, as little-endian u32 values:
;;   1. the status and the length word after entry_name(dst=256, cap=2):
;;      a destination too small gets OUT_OF_BOUNDS and the length only;
;;   2. the status, the length word and the 16 bytes at 256 after
;;      entry_name(dst=256, cap=64): OK, the length and the name;
;;   3. the status and the length word after entry_name with a
;;      destination outside memory: OUT_OF_BOUNDS, nothing written.
;; The length word at 128 is set to 0xAAAAAAAA before each call and the
;; bytes at 256 to 0xBB, so what was written shows.
(module
  (import "stagehost_v1" "entry_name" (func $entry_name (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func $reset
    (i32.store (i32.const 128) (i32.const 0xAAAAAAAA))
    (memory.fill (i32.const 256) (i32.const 0xBB) (i32.const 16)))
  (func $emit (param $status i32)
    (i32.store (i32.const 64) (local.get $status))
    (drop (call $output_write (i32.const 64) (i32.const 4)))
    (drop (call $output_write (i32.const 128) (i32.const 4))))
  (func (export "stagehost_run") (result i32)
    (call $reset)
    (call $emit (call $entry_name (i32.const 256) (i32.const 2) (i32.const 128)))
    (call $reset)
    (call $emit (call $entry_name (i32.const 256) (i32.const 64) (i32.const 128)))
    (drop (call $output_write (i32.const 256) (i32.const 16)))
    (call $reset)
    (call $emit (call $entry_name (i32.const 0xFFFFFF00) (i32.const 64) (i32.const 128)))
    (i32.const 0)))

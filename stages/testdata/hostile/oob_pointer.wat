;; oob_pointer: five host calls with out-of-bounds pointers or lengths
;; against a memory of exactly one page (65536 bytes). Each status is
;; stored as an i32 LE in a scratch area at 1024; the 20-byte scratch area
;; is then written to the output. Every status must be OUT_OF_BOUNDS (14).
;;   a  output_write(0xFFFFFFF0, 64)        src range wraps past 4 GiB
;;   b  input_read(0, 65530, 100, 0)        dst range crosses the end
;;   c  stream_get(70000, 2, 0)             name pointer past the end
;;   d  input_size(0xFFFFFFFF)              out pointer at the last u32 of 4 GiB
;;   e  error_set(0, 0x7FFFFFFF)            src range far past the end
;;                                          (bounds check before truncation)
(module
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "input_size" (func $input_size (param i32) (result i32)))
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.store (i32.const 1024) (call $output_write (i32.const 0xFFFFFFF0) (i32.const 64)))
    (i32.store (i32.const 1028) (call $input_read (i32.const 0) (i32.const 65530) (i32.const 100) (i32.const 0)))
    (i32.store (i32.const 1032) (call $stream_get (i32.const 70000) (i32.const 2) (i32.const 0)))
    (i32.store (i32.const 1036) (call $input_size (i32.const 0xFFFFFFFF)))
    (i32.store (i32.const 1040) (call $error_set (i32.const 0) (i32.const 0x7FFFFFFF)))
    (drop (call $output_write (i32.const 1024) (i32.const 20)))
    (i32.const 0)))

;; stale_handle: buffer_alloc(64) -> handle; buffer_free(handle); then
;; buffer_size(handle) and writes that status as an i32 LE. Expected
;; STALE_HANDLE (12). Setup failures are client errors: 100 buffer_alloc,
;; 101 buffer_free.
(module
  (import "stagehost_v1" "buffer_alloc" (func $buffer_alloc (param i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_free" (func $buffer_free (param i64) (result i32)))
  (import "stagehost_v1" "buffer_size" (func $buffer_size (param i64 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 256) "buffer_alloc failed") ;; 19 bytes
  (data (i32.const 288) "buffer_free failed")  ;; 18 bytes
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (if (call $buffer_alloc (i32.const 64) (i32.const 64))
      (then
        (drop (call $error_set (i32.const 256) (i32.const 19)))
        (return (i32.const 100))))
    (if (call $buffer_free (i64.load (i32.const 64)))
      (then
        (drop (call $error_set (i32.const 288) (i32.const 18)))
        (return (i32.const 101))))
    (i32.store (i32.const 128) (call $buffer_size (i64.load (i32.const 64)) (i32.const 80)))
    (drop (call $output_write (i32.const 128) (i32.const 4)))
    (i32.const 0)))

;; named_alloc: allocates (or finds again) a 64-byte buffer named "weights"
;; with buffer_alloc_named and writes its handle (i64 LE) to the output.
;; With input byte 0 = 1 it traps after allocating, so the host replaces
;; the instance; with input byte 0 = 2 it asks for the same name with
;; another size and writes that status (i32 LE) instead.
;; A failing call returns client error 100 + the step.
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_alloc_named" (func $alloc_named (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "weights")
  ;; 0: input byte, 4: input count, 64: handle, 80: status
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (if (call $input_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 4))
      (then (return (i32.const 100))))
    (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 2))
      (then
        (i32.store (i32.const 80) (call $alloc_named (i32.const 16) (i32.const 7) (i32.const 128) (i32.const 64)))
        (drop (call $output_write (i32.const 80) (i32.const 4)))
        (return (i32.const 0))))
    (if (call $alloc_named (i32.const 16) (i32.const 7) (i32.const 64) (i32.const 64))
      (then (return (i32.const 101))))
    (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 1))
      (then unreachable))
    (if (call $output_write (i32.const 64) (i32.const 8))
      (then (return (i32.const 102))))
    (i32.const 0)))

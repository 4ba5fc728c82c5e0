;; echo: copies its input to its output, 32 KiB at a time (input_read into
;; memory at 0, output_write from there), whatever its length. Returns 7
;; (client error, message "echo failed") if a call's status was non-zero.
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 40000) "echo failed") ;; 11 bytes
  (func $fail (result i32)
    (drop (call $error_set (i32.const 40000) (i32.const 11)))
    (i32.const 7))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $off i32) (local $n i32)
    (loop $copy
      ;; n = min(32768, len - off), written at 32768
      (if (call $input_read (local.get $off) (i32.const 0) (i32.const 32768) (i32.const 32768))
        (then (return (call $fail))))
      (local.set $n (i32.load (i32.const 32768)))
      (if (local.get $n)
        (then
          (if (call $output_write (i32.const 0) (local.get $n))
            (then (return (call $fail))))
          (local.set $off (i32.add (local.get $off) (local.get $n)))
          (br $copy))))
    (i32.const 0)))

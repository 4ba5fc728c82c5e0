;; Reads its whole input into memory at 64 KiB and writes it back as output.
;; Measures input and output bandwidth through guest memory.
(module
  (import "stagehost_v1" "input_size" (func $input_size (param i32) (result i32)))
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 40 40)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $n i32)
    (if (call $input_size (i32.const 0)) (then (return (i32.const 100))))
    (local.set $n (i32.load (i32.const 0)))
    (if (call $input_read (i32.const 0) (i32.const 65536) (local.get $n) (i32.const 4)) (then (return (i32.const 101))))
    (if (call $output_write (i32.const 65536) (local.get $n)) (then (return (i32.const 102))))
    (i32.const 0)))

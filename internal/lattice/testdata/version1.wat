;; version1: answers "v1" whatever its input: a stage whose output names
;; its version, for the lattice's swap tests.
(module
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 0) "v1")
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (drop (call $output_write (i32.const 0) (i32.const 2)))
    (i32.const 0)))

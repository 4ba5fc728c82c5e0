;; snap_optout: exports stagehost_no_snapshot, so every instance
;; initialises itself. Each call outputs "ok".
(module
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 32) "ok")
  (func (export "stagehost_no_snapshot"))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (drop (call $output_write (i32.const 32) (i32.const 2)))
    (i32.const 0)))

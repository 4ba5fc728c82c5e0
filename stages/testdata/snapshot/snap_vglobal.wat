;; snap_vglobal: has a mutable v128 global, whose value a snapshot cannot
;; read back as a number: the module is not snapshotted. Each call
;; outputs "ok".
(module
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (global $v (mut v128) (v128.const i32x4 1 2 3 4))
  (data (i32.const 32) "ok")
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (global.set $v (i32x4.splat (i32.const 5)))
    (drop (call $output_write (i32.const 32) (i32.const 2)))
    (i32.const 0)))

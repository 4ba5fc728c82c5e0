;; snap_table: a function uses table.set, so initialisation could change
;; the table, which a snapshot does not capture: the module is not
;; snapshotted. Each call outputs "ok".
(module
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (table $t 1 funcref)
  (data (i32.const 32) "ok")
  (func $unused (table.set $t (i32.const 0) (ref.null func)))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (drop (call $output_write (i32.const 32) (i32.const 2)))
    (i32.const 0)))

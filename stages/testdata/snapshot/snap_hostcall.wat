;; snap_hostcall: its start function calls stagehost_v1.log. There is no
;; session at load, so the module is not snapshotted: every instance runs
;; its start function, and logs, itself. Each call outputs "ok".
(module
  (import "stagehost_v1" "log" (func $log (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "started")
  (data (i32.const 32) "ok")
  (func $start (drop (call $log (i32.const 1) (i32.const 16) (i32.const 7))))
  (start $start)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (drop (call $output_write (i32.const 32) (i32.const 2)))
    (i32.const 0)))

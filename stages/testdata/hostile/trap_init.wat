;; trap_init: stagehost_init executes `unreachable`. NewSession fails with
;; a Fault-class error naming stagehost_init; no session exists.
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_init") (result i32)
    unreachable)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

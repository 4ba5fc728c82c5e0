;; trap_stage: stagehost_run traps with `unreachable`. The host must report
;; a Fault-class error naming the trap, replace the instance, and run the
;; built-in fence, which drains (no quarantine).
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (unreachable)))

;; trap_fence: the stage succeeds, but the module's own fence traps. The
;; host must quarantine the session.
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.const 0))
  (func (export "stagehost_fence") (result i32)
    (unreachable)))

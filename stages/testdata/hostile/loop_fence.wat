;; loop_fence: the stage succeeds, but the module's own fence never returns.
;; The host must interrupt the fence at the fence deadline and quarantine
;; the session (the fence cannot be proven).
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.const 0))
  (func (export "stagehost_fence") (result i32)
    (loop $spin (br $spin))
    (i32.const 0)))

;; drain_fence: a fence-only module. It exports stagehost_fence and no
;; stagehost_run, so it is valid only with kind = "fence".
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_fence") (result i32)
    (i32.const 0)))

;; loop_stage: stagehost_run never returns. The host must interrupt it at
;; the stage deadline (DeadlineExceeded), replace the instance, and run the
;; built-in fence, which drains (no quarantine).
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (loop $spin (br $spin))
    (i32.const 0)))

;; The smallest stage: returns 0. Used to measure the host's own overhead.
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32) (i32.const 0)))

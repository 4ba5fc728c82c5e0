;; no_marker: exports memory and stagehost_run but no stagehost_abi_v*
;; marker. Rejected at load (InvalidArgument, "missing ABI marker").
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

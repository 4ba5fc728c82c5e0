;; wrong_version: exports the marker stagehost_abi_v2 instead of v1.
;; Rejected at load (Unsupported, naming both versions).
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v2"))
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

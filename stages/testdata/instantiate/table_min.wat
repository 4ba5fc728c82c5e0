;; table_min: a stage module whose table's minimum, 2,000,000 elements,
;; is above the host's cap (stages.MaxTableElements): refused at load.
(module
  (memory (export "memory") 1 1)
  (table 2000000 funcref)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32) (i32.const 0)))

;; data_oob: a stage module without a start function whose active data
;; segment ends past its one page of memory: instantiating it traps (the
;; segment), which the host reports as the instantiation's failure, not
;; a start function's (TestInstantiationTrapWithoutAStartFunction).
(module
  (memory (export "memory") 1 1)
  (data (i32.const 65530) "12345678")
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32) (i32.const 0)))

;; loop_initialize: the WASI reactor initialiser `_initialize` runs
;; `loop br 0` forever. The host calls it after instantiation and must
;; interrupt it at the init timeout: NewSession fails with
;; DeadlineExceeded naming _initialize.
(module
  (memory (export "memory") 1 1)
  (func (export "_initialize")
    (loop $spin (br $spin)))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

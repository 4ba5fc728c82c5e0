;; loop_init: stagehost_init runs `loop br 0` forever. The host must
;; interrupt it at the init timeout: NewSession fails with
;; DeadlineExceeded naming stagehost_init.
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_init") (result i32)
    (loop $spin (br $spin))
    (i32.const 0))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

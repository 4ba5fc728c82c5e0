;; init_loop: stagehost_init never returns. The host must interrupt it at
;; the session's init timeout and record the session as failed, naming
;; the deadline, while the others run.
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_init") (result i32)
    (loop $spin (br $spin))
    (i32.const 0))
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

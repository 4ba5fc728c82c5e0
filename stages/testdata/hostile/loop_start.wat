;; loop_start: the module's start function runs `loop br 0` forever, so
;; instantiation itself never returns. The host must interrupt it at the
;; init timeout: NewSession fails with DeadlineExceeded naming the start
;; function, and no session exists.
(module
  (memory (export "memory") 1 1)
  (func $spin
    (loop $spin (br $spin)))
  (start $spin)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

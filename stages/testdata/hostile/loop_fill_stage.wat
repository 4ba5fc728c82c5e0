;; loop_fill_stage: stagehost_run fills its 16 MiB of memory over and over,
;; forever. Each memory.fill is one instruction doing 16 MiB of work; the
;; host must still interrupt it at the stage deadline (DeadlineExceeded),
;; within about one fill, replace the instance and drain (no quarantine).
(module
  (memory (export "memory") 256 256)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (loop $spin
      (memory.fill (i32.const 0) (i32.const 1) (i32.const 16777216))
      (br $spin))
    (i32.const 0)))

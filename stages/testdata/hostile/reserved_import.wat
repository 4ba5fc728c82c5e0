;; reserved_import: imports stagehost_internal.yield () -> (i32), the
;; host's own instrumentation hook, with its exact type, and calls it. The
;; namespace stagehost_internal is reserved: refused at load
;; (InvalidArgument), the message saying it is reserved.
(module
  (import "stagehost_internal" "yield" (func $yield (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (drop (call $yield))
    (i32.const 0)))

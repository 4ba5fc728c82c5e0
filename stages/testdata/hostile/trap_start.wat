;; trap_start: the start function calls a function that executes
;; `unreachable`. The module has no name section, so the engine names the
;; functions by index: the host must report the guest's own indices
;; (start function[0], .$1 and .$0), as the engine does for the module
;; as it was loaded, although the host's instrumentation adds a function
;; import before them.
(module
  (memory (export "memory") 1 1)
  (func $start (call $boom))
  (func $boom (unreachable))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32) (i32.const 0))
  (start $start))

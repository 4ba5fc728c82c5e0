;; trap_nested: stagehost_run (function 1) calls function 2, which calls
;; function 3, which executes `unreachable`. The module has no name
;; section: the stack trace must name .$3, .$2 and .$1, the guest's own
;; indices, as the engine does for the module as it was loaded.
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32) (call $a) (i32.const 0))
  (func $a (call $b))
  (func $b (unreachable)))

;; init_trap: stagehost_init traps (unreachable), so no instance of the
;; module can be made and a session of it cannot be created. The host
;; must record that session as failed and run the others.
(module
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_init") (result i32)
    (unreachable))
  (func (export "stagehost_run") (result i32)
    (i32.const 0)))

;; unknown_import: imports env.exfiltrate (i32) -> i32, a module the host
;; does not provide. Rejected at load (InvalidArgument, naming the import).
(module
  (import "env" "exfiltrate" (func $exfiltrate (param i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (call $exfiltrate (i32.const 0))))

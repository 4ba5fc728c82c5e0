;; client_error: a well-behaved client error, for contrast. Sets the error
;; message "bad input" and returns 3. No quarantine.
(module
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "bad input") ;; 9 bytes
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (drop (call $error_set (i32.const 16) (i32.const 9)))
    (i32.const 3)))

;; bad_signature: imports stagehost_v1.stream_sync with the wrong type
;; (i32) -> i32 instead of (i64) -> i32. Rejected at load (InvalidArgument,
;; naming the import).
(module
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (call $stream_sync (i32.const 7))))

;; Imports a host function: a vendor kernel imports nothing.
(module
  (import "stagehost_v1" "stream_sync" (func (param i64 i64) (result i32)))
  (memory (export "memory") 1)
  (func (export "double") (param i32 i32 i32 i32 i32)))

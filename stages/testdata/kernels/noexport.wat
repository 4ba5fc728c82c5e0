;; Exports its function under another name.
(module
  (memory (export "memory") 1)
  (func (export "triple") (param i32 i32 i32 i32 i32)))

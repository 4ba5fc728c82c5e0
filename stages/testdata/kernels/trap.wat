;; Traps at once.
(module
  (memory (export "memory") 1)
  (func (export "double") (param i32 i32 i32 i32 i32)
    unreachable))

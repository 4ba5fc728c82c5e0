;; Takes a single i32 where the declaration needs (i32, i32, i32, i32, i32).
(module
  (memory (export "memory") 1)
  (func (export "double") (param i32)))

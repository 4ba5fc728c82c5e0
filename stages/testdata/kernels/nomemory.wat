;; Does not export its memory.
(module
  (memory 1)
  (func (export "double") (param i32 i32 i32 i32 i32)))

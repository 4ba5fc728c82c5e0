;; Stores far outside its memory (a pointer it was never given).
(module
  (memory (export "memory") 1)
  (func (export "double") (param i32 i32 i32 i32 i32)
    (i32.store (i32.const 0x7ffffff0) (i32.const 1))))

;; Spins forever: interrupted at the launch's time limit.
(module
  (memory (export "memory") 1)
  (func (export "double") (param i32 i32 i32 i32 i32)
    (loop $l (br $l))))

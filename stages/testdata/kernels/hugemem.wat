;; Asks for 4 GiB of memory (refused: memory.grow gives -1), then
;; stores where that memory would have been.
(module
  (memory (export "memory") 1)
  (func (export "double") (param i32 i32 i32 i32 i32)
    (if (i32.eq (memory.grow (i32.const 65535)) (i32.const -1))
      (then (i32.store (i32.const 0x40000000) (i32.const 1))))))

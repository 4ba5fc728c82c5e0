;; Fills its 32 MiB of memory over and over, forever: one memory.fill, 32
;; MiB of work, per iteration. Interrupted at the launch's time limit
;; within about one fill, as a plain loop is (TestKernelCorpus gives it a
;; 64 MiB memory limit).
(module
  (memory (export "memory") 512)
  (func (export "double") (param i32 i32 i32 i32 i32)
    (loop $l
      (memory.fill (i32.const 0) (i32.const 1) (i32.const 33554432))
      (br $l))))

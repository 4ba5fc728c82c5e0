;; Declares a memory of at least 8192 pages (512 MiB), over the kernel
;; memory limit (256 MiB by default): it could never be instantiated, so
;; the check and the load refuse it.
(module
  (memory (export "memory") 8192)
  (func (export "double") (param i32 i32 i32 i32 i32)))

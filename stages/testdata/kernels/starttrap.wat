;; Its start function (function 0) traps, so no instance of it can be
;; made: every launch fails, naming start function[0], the module's own
;; index (the instrumented module's start function has another).
(module
  (memory (export "memory") 1)
  (func $start unreachable)
  (start $start)
  (func (export "double") (param i32 i32 i32 i32 i32)))

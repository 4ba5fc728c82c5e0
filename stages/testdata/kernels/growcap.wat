;; Grows its memory one page at a time until memory.grow fails (at the
;; kernel memory limit), filling every new page with ones, then stores
;; the pages it reached at y[0]: the most memory a launch can use.
(module
  (memory (export "memory") 1)
  (func (export "double") (param $x i32) (param $xlen i32) (param $y i32) (param $ylen i32) (param $n i32)
    (local $p i32)
    (block $full
      (loop $more
        (local.set $p (memory.grow (i32.const 1)))
        (br_if $full (i32.eq (local.get $p) (i32.const -1)))
        (memory.fill (i32.mul (local.get $p) (i32.const 65536)) (i32.const 1) (i32.const 65536))
        (br $more)))
    (i32.store (local.get $y) (memory.size))))

;; Declares a maximum of 65536 pages (4 GiB), over the kernel memory
;; limit: allowed, since the load caps the maximum at the limit (growing
;; past it fails). Otherwise it is double.
(module
  (memory (export "memory") 1 65536)
  (func (export "double") (param $x i32) (param $xlen i32) (param $y i32) (param $ylen i32) (param $n i32)
    (local $i i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (f32.store (i32.add (local.get $y) (i32.shl (local.get $i) (i32.const 2)))
          (f32.mul (f32.const 2)
            (f32.load (i32.add (local.get $x) (i32.shl (local.get $i) (i32.const 2))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))))

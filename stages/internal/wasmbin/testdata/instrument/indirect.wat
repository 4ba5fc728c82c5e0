;; call_indirect through tables filled by active and passive element
;; segments, ref.func in code and in a global initialiser, table.init,
;; elem.drop, table.grow/size/fill/get/set and typed select.
(module
  (import "env" "add" (func $add (param i32 i32) (result i32)))
  (type $bin (func (param i32 i32) (result i32)))
  (table $t 8 funcref)
  (table $u 4 externref)
  (global $g funcref (ref.func $mul))
  (elem (table $t) (i32.const 0) func $add $sub $mul)
  (elem $p funcref (ref.func $sub) (ref.null func) (ref.func $max))
  (elem declare func $max)

  (func $sub (param i32 i32) (result i32) (i32.sub (local.get 0) (local.get 1)))
  (func $mul (param i32 i32) (result i32) (i32.mul (local.get 0) (local.get 1)))
  (func $max (param i32 i32) (result i32)
    (select (result i32) (local.get 0) (local.get 1) (i32.gt_s (local.get 0) (local.get 1))))

  ;; Sums f(i, 3) over i in 0..50 for every function slot 0..2.
  (func $dispatch (export "dispatch") (result i32)
    (local $i i32) (local $f i32) (local $s i32)
    (loop $lf
      (local.set $i (i32.const 0))
      (loop $li
        (local.set $s (i32.add (local.get $s)
          (call_indirect $t (type $bin) (local.get $i) (i32.const 3) (local.get $f))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $li (i32.lt_u (local.get $i) (i32.const 50))))
      (local.set $f (i32.add (local.get $f) (i32.const 1)))
      (br_if $lf (i32.lt_u (local.get $f) (i32.const 3))))
    (local.get $s))

  (func $passive (export "passive") (result i32)
    (table.init $t $p (i32.const 4) (i32.const 0) (i32.const 3))
    (elem.drop $p)
    (table.set $t (i32.const 6) (ref.func $max))
    (table.set $t (i32.const 7) (global.get $g))
    (i32.add
      (i32.add
        (call_indirect $t (type $bin) (i32.const 9) (i32.const 4) (i32.const 4))
        (call_indirect $t (type $bin) (i32.const 9) (i32.const 4) (i32.const 6)))
      (i32.add
        (call_indirect $t (type $bin) (i32.const 9) (i32.const 4) (i32.const 7))
        (i32.mul (i32.const 100) (ref.is_null (table.get $t (i32.const 5)))))))

  (func $tables (export "tables") (result i32)
    (drop (table.grow $u (ref.null extern) (i32.const 2)))
    (table.fill $u (i32.const 0) (ref.null extern) (i32.const 6))
    (i32.add (table.size $u) (table.size $t)))

  (func $reffunc (export "reffunc") (result i32)
    (ref.is_null (ref.func $sub))))

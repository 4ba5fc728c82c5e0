;; calls: work spread over many short calls, so that a countdown kept in
;; a local per function must be stored back at every way out of a
;; function (fall-through, return, br to the body, br_table to the body)
;; or the callees' work would go uncounted.
(module
  (import "env" "add" (func $add (param i32 i32) (result i32)))
  ;; Each leaf loops 60 times (about 780 instructions, under the test's
  ;; fuel of 1000), then leaves its own way. This one falls through its
  ;; final end.
  (func $leaf (param $x i32) (result i32)
    (local $i i32)
    (loop $l
      (local.set $x (i32.add (local.get $x) (i32.const 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 60))))
    (local.get $x))
  ;; Leaves by return.
  (func $leaf_return (param $x i32) (result i32)
    (local $i i32)
    (loop $l
      (local.set $x (i32.add (local.get $x) (i32.const 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 60))))
    (return (local.get $x)))
  ;; Leaves by a br to the function's own label.
  (func $leaf_br (param $x i32) (result i32)
    (local $i i32)
    (loop $l
      (local.set $x (i32.add (local.get $x) (i32.const 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 60))))
    (local.get $x)
    (br 0))
  ;; Leaves by a br_table whose default is the function's own label.
  (func $leaf_table (param $x i32) (result i32)
    (local $i i32)
    (loop $l
      (local.set $x (i32.add (local.get $x) (i32.const 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 60))))
    (local.get $x)
    (br_table 0 (i32.const 0)))
  (func $drive (param $which i32) (result i32)
    (local $n i32) (local $x i32)
    (loop $l
      (block $done
        (block $table
          (block $br
            (block $ret
              (block $fall
                (br_table $fall $ret $br $table (local.get $which)))
              (local.set $x (call $leaf (local.get $x)))
              (br $done))
            (local.set $x (call $leaf_return (local.get $x)))
            (br $done))
          (local.set $x (call $leaf_br (local.get $x)))
          (br $done))
        (local.set $x (call $leaf_table (local.get $x))))
      (local.set $n (call $add (local.get $n) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $n) (i32.const 100))))
    (local.get $x))
  (func $fallthrough (export "fallthrough") (result i32) (call $drive (i32.const 0)))
  (func $return (export "return") (result i32) (call $drive (i32.const 1)))
  (func $br (export "br") (result i32) (call $drive (i32.const 2)))
  (func $br_table (export "br_table") (result i32) (call $drive (i32.const 3))))

;; exits: loops left from inside in every way (a br to an enclosing
;; block, a br to the function's own label, a br_table, a return, a
;; branch out of a nested loop, the end of a loop with parameters), so
;; that a countdown kept in a local must reach the global on each of
;; them, or the leaves' work would go uncounted.
(module
  (import "env" "add" (func $add (param i32 i32) (result i32)))
  ;; Each leaf loops 40 times (500 to 700 instructions, under the
  ;; test's fuel of 1000), then leaves the loop its own way. This one by a
  ;; br_if to an enclosing block.
  (func $leaf_block (param $x i32) (result i32)
    (local $i i32)
    (block $out
      (loop $l
        (local.set $x (i32.add (local.get $x) (i32.const 1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $out (i32.ge_u (local.get $i) (i32.const 40)))
        (br $l)))
    (local.get $x))
  ;; By a br_if to the function's own label.
  (func $leaf_body (param $x i32) (result i32)
    (local $i i32)
    (loop $l
      (local.set $x (i32.add (local.get $x) (i32.const 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if 1 (local.get $x) (i32.ge_u (local.get $i) (i32.const 40)))
      (br $l))
    (unreachable))
  ;; By a br_table whose second target encloses the loop.
  (func $leaf_table (param $x i32) (result i32)
    (local $i i32)
    (block $out
      (loop $l
        (local.set $x (i32.add (local.get $x) (i32.const 1)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_table $l $out (i32.ge_u (local.get $i) (i32.const 40)))))
    (local.get $x))
  ;; By a return inside an if.
  (func $leaf_return (param $x i32) (result i32)
    (local $i i32)
    (loop $l
      (local.set $x (i32.add (local.get $x) (i32.const 1)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (if (i32.ge_u (local.get $i) (i32.const 40))
        (then (return (local.get $x))))
      (br $l))
    (unreachable))
  ;; From a nested loop, past the outer one.
  (func $leaf_nested (param $x i32) (result i32)
    (local $i i32)
    (block $out
      (loop $a
        (loop $b
          (local.set $x (i32.add (local.get $x) (i32.const 1)))
          (local.set $i (i32.add (local.get $i) (i32.const 1)))
          (br_if $out (i32.ge_u (local.get $i) (i32.const 40)))
          (br $b))))
    (local.get $x))
  ;; A loop with parameters, left by falling through its end.
  (func $leaf_params (param $x i32) (result i32)
    (local $i i32)
    local.get $x
    (loop $l (param i32) (result i32)
      i32.const 1
      i32.add
      local.tee $x
      local.get $i
      i32.const 1
      i32.add
      local.tee $i
      i32.const 40
      i32.lt_u
      br_if $l))
  (func $drive (param $which i32) (result i32)
    (local $n i32) (local $x i32)
    (loop $l
      (block $done
        (block $p
          (block $nest
            (block $ret
              (block $table
                (block $body
                  (block $blk
                    (br_table $blk $body $table $ret $nest $p (local.get $which)))
                  (local.set $x (call $leaf_block (local.get $x)))
                  (br $done))
                (local.set $x (call $leaf_body (local.get $x)))
                (br $done))
              (local.set $x (call $leaf_table (local.get $x)))
              (br $done))
            (local.set $x (call $leaf_return (local.get $x)))
            (br $done))
          (local.set $x (call $leaf_nested (local.get $x)))
          (br $done))
        (local.set $x (call $leaf_params (local.get $x))))
      (local.set $n (call $add (local.get $n) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $n) (i32.const 100))))
    (local.get $x))
  (func $block (export "block") (result i32) (call $drive (i32.const 0)))
  (func $body (export "body") (result i32) (call $drive (i32.const 1)))
  (func $table (export "table") (result i32) (call $drive (i32.const 2)))
  (func $return (export "return") (result i32) (call $drive (i32.const 3)))
  (func $nested (export "nested") (result i32) (call $drive (i32.const 4)))
  (func $params (export "params") (result i32) (call $drive (i32.const 5))))

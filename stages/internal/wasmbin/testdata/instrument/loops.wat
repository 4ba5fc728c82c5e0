;; Loops, recursion, br_table, multi-value blocks and loops with
;; parameters, a start function and an imported function.
(module
  (import "env" "add" (func $add (param i32 i32) (result i32)))
  (global $started (mut i32) (i32.const 0))
  (func $start (global.set $started (i32.const 42)))
  (start $start)

  ;; Triple nested loop: sum of i*j+k.
  (func $nested (export "nested") (result i32)
    (local $i i32) (local $j i32) (local $k i32) (local $s i32)
    (loop $li
      (local.set $j (i32.const 0))
      (loop $lj
        (local.set $k (i32.const 0))
        (loop $lk
          (local.set $s (i32.add (local.get $s)
            (i32.add (i32.mul (local.get $i) (local.get $j)) (local.get $k))))
          (local.set $k (i32.add (local.get $k) (i32.const 1)))
          (br_if $lk (i32.lt_u (local.get $k) (i32.const 7))))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br_if $lj (i32.lt_u (local.get $j) (i32.const 11))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $li (i32.lt_u (local.get $i) (i32.const 13))))
    (local.get $s))

  (func $fib (param $n i32) (result i32)
    (if (result i32) (i32.lt_u (local.get $n) (i32.const 2))
      (then (local.get $n))
      (else (call $add
        (call $fib (i32.sub (local.get $n) (i32.const 1)))
        (call $fib (i32.sub (local.get $n) (i32.const 2)))))))
  (func $fib20 (export "fib") (result i32) (call $fib (i32.const 20)))

  ;; A state machine driven by br_table.
  (func $switch (export "switch") (result i32)
    (local $n i32) (local $acc i32)
    (loop $top
      (block $d (block $c (block $b (block $a
        (br_table $a $b $c $d (i32.rem_u (local.get $n) (i32.const 5))))
        (local.set $acc (i32.add (local.get $acc) (i32.const 1))) (br $d))
        (local.set $acc (i32.mul (local.get $acc) (i32.const 3))) (br $d))
        (local.set $acc (i32.xor (local.get $acc) (i32.const 0x55))))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br_if $top (i32.lt_u (local.get $n) (i32.const 1000))))
    (local.get $acc))

  ;; A loop with parameters and results: fold 1..100 on the stack.
  (func $multi (export "multi") (result i32 i64)
    (local $i i32)
    (i32.const 0) (i64.const 1) (i32.const 1)
    (loop $l (param i32 i64 i32) (result i32 i64)
      (call $step)
      (local.tee $i)
      (br_if $l (i32.le_u (local.get $i) (i32.const 100)))
      (drop))
    (block $b (param i32 i64) (result i32 i64)
      (loop $m (param i32 i64) (result i32 i64))))
  (func $step (param $s i32) (param $p i64) (param $i i32) (result i32 i64 i32)
    (i32.add (local.get $s) (local.get $i))
    (i64.rem_u (i64.mul (local.get $p) (i64.extend_i32_u (local.get $i))) (i64.const 1000000007))
    (i32.add (local.get $i) (i32.const 1)))

  (func $started (export "started") (result i32) (global.get $started))
  (func $noloop (export "noloop") (result i32) (i32.const 5)))

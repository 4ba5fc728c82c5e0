;; Fixed-width SIMD in a loop: loads, shuffles, lanes and arithmetic.
(module
  (memory 1)
  (data (i32.const 0) "\00\01\02\03\04\05\06\07\08\09\0a\0b\0c\0d\0e\0f")
  (func $simd (export "simd") (result i32)
    (local $v v128) (local $i i32)
    (local.set $v (v128.load (i32.const 0)))
    (loop $l
      (local.set $v
        (i8x16.shuffle 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 0
          (i32x4.add (local.get $v) (v128.const i32x4 1 2 3 4))
          (local.get $v)))
      (local.set $v (i16x8.replace_lane 3 (local.get $v) (local.get $i)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 100))))
    (v128.store (i32.const 32) (local.get $v))
    (local.set $v (v128.load32_lane 1 (i32.const 4) (local.get $v)))
    (v128.store8_lane 15 (i32.const 48) (local.get $v))
    (i32.add
      (i32.add (i32x4.extract_lane 0 (local.get $v)) (i32x4.extract_lane 3 (local.get $v)))
      (i32.add (i8x16.bitmask (local.get $v))
        (i32x4.extract_lane 2 (i32x4.dot_i16x8_s (local.get $v) (local.get $v)))))
    (i32.add (i32.load8_u (i32.const 48)))))

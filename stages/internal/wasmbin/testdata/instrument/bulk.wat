;; Bulk memory (memory.init, data.drop, memory.copy, memory.fill) and
;; loops over memory, with the non-trapping conversions and sign
;; extension.
(module
  (memory 1)
  (data $hello "hello, instrumented world")
  (data (i32.const 1024) "\01\02\03\04\05\06\07\08")

  (func $bulk (export "bulk") (result i32)
    (local $i i32) (local $h i32)
    (memory.init $hello (i32.const 64) (i32.const 0) (i32.const 25))
    (data.drop $hello)
    (memory.copy (i32.const 200) (i32.const 64) (i32.const 25))
    (memory.fill (i32.const 210) (i32.const 0x2a) (i32.const 5))
    (loop $l
      (local.set $h (i32.add (i32.mul (local.get $h) (i32.const 31))
        (i32.load8_u offset=200 (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 25))))
    (local.get $h))

  (func $convert (export "convert") (result i64)
    (i64.add
      (i64.extend_i32_s (i32.trunc_sat_f64_s (f64.const 1e12)))
      (i64.add (i64.extend8_s (i64.const 0x80))
        (i64.extend_i32_u (i32.extend16_s (i32.const 0x8001))))))

  (func $grow (export "grow") (result i32)
    (i32.add (memory.grow (i32.const 1)) (memory.size))))

;; muladd: the tightest loop, for measuring the cost of interruption. It
;; runs n iterations of x = x * 3 + i (i32, wrapping) and outputs x as 4
;; little-endian bytes; n comes from the input (a little-endian u32; 1000
;; if there is none). The loop is also exported as `muladd(n) -> i32`, so
;; a benchmark can call it directly on a plain, uninstrumented instance.
(module
  (import "stagehost_v1" "input_size" (func $input_size (param i32) (result i32)))
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (func (export "stagehost_abi_v1"))
  (func $muladd (export "muladd") (param $n i32) (result i32)
    (local $i i32) (local $x i32)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 3)) (local.get $i)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (local.get $x))
  (func (export "stagehost_run") (result i32)
    (local $n i32)
    (local.set $n (i32.const 1000))
    (if (i32.eqz (call $input_size (i32.const 0)))
      (then
        (if (i32.ge_u (i32.load (i32.const 0)) (i32.const 4))
          (then
            (drop (call $input_read (i32.const 0) (i32.const 8) (i32.const 4) (i32.const 4)))
            (local.set $n (i32.load (i32.const 8)))))))
    (i32.store (i32.const 16) (call $muladd (local.get $n)))
    (call $output_write (i32.const 16) (i32.const 4))))

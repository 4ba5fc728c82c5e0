;; deep_recursion: stagehost_run calls a function that recurses without
;; bound (not a tail call; each frame carries a few locals), exhausting the
;; call stack. The host must report a Fault-class error naming the trap
;; (stack overflow), replace the instance and run the built-in fence
;; (no quarantine).
(module
  (memory (export "memory") 1 1)
  (func $recurse (param $n i32) (result i32)
    (local $a i64) (local $b i64) (local $c i64) (local $d i32)
    (local.set $a (i64.extend_i32_u (local.get $n)))
    (local.set $b (i64.mul (local.get $a) (i64.const 3)))
    (local.set $c (i64.add (local.get $a) (local.get $b)))
    (local.set $d (call $recurse (i32.add (local.get $n) (i32.const 1))))
    (i32.add (local.get $d) (i32.wrap_i64 (local.get $c))))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (call $recurse (i32.const 0))))

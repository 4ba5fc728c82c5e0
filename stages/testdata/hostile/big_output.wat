;; big_output: writes 64 KiB of output as 16 output_write calls of 4 KiB
;; (the bytes 0..4095 of memory, filled with 0x5A), storing each status as
;; an i32 LE at 8192+4*i. Returns 7 (client error, message "output_write
;; failed") if any status was non-zero, else 0.
(module
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "error_set" (func $error_set (param i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16384) "output_write failed") ;; 19 bytes
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $i i32) (local $st i32) (local $bad i32)
    (memory.fill (i32.const 0) (i32.const 0x5A) (i32.const 4096))
    (loop $write
      (local.set $st (call $output_write (i32.const 0) (i32.const 4096)))
      (i32.store (i32.add (i32.const 8192) (i32.shl (local.get $i) (i32.const 2))) (local.get $st))
      (local.set $bad (i32.or (local.get $bad) (local.get $st)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $write (i32.lt_u (local.get $i) (i32.const 16))))
    (if (local.get $bad)
      (then
        (drop (call $error_set (i32.const 16384) (i32.const 19)))
        (return (i32.const 7))))
    (i32.const 0)))

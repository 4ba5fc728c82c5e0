;; snap_table_gap: a table of 200 entries whose element segment starts at
;; entry 128, so a snapshot drops the 128 empty entries before it. Each
;; call reads one input byte i and outputs two i32s: table.size (200) and
;; the result of call_indirect through entry 128 + i (11 for i = 0, 22 for
;; i = 1). Input "x" calls through entry 5, which is empty: a trap.
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (type $r (func (result i32)))
  (memory (export "memory") 1 1)
  (table $t 200 funcref)
  (elem (i32.const 128) $eleven $twentytwo)
  (func $eleven (result i32) (i32.const 11))
  (func $twentytwo (result i32) (i32.const 22))
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (local $i i32)
    (drop (call $input_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (local.set $i (i32.add (i32.const 128) (i32.load8_u (i32.const 0))))
    (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 120)) ;; 'x'
      (then (local.set $i (i32.const 5))))
    (i32.store (i32.const 16) (table.size $t))
    (i32.store (i32.const 20) (call_indirect $t (type $r) (local.get $i)))
    (drop (call $output_write (i32.const 16) (i32.const 8)))
    (i32.const 0)))

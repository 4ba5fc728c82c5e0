;; Instructions whose work grows with an operand: bulk memory and table
;; instructions charge their length, and memory.grow calls the host
;; (TestBulkWorkIsCharged). Each export is also checked for computing
;; what the plain module does.
(module
  (memory 64)  ;; 4 MiB
  (table $t 4096 funcref)
  (data $d "0123456789abcdef0123456789abcdef")
  (elem $e func $f $f $f $f)
  (func $f)

  ;; No loop: one fill of 4 MiB.
  (func $fill (export "fill") (result i32)
    (memory.fill (i32.const 0) (i32.const 7) (i32.const 4194304))
    (i32.load8_u (i32.const 4194303)))

  ;; In a loop: 16 copies of 1 MiB.
  (func $copy_loop (export "copy_loop") (result i32)
    (local $i i32)
    (loop $l
      (memory.copy (i32.const 1048576) (i32.const 0) (i32.const 1048576))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 16))))
    (local.get $i))

  ;; memory.init keeps its operands: the bytes land where they should.
  (func $init (export "init") (result i32)
    (memory.init $d (i32.const 100) (i32.const 4) (i32.const 8))
    (i32.load8_u (i32.const 103)))

  ;; Table instructions: a fill of 4096 elements, then init and copy.
  (func $tables (export "tables") (result i32)
    (table.fill $t (i32.const 0) (ref.null func) (i32.const 4096))
    (table.init $t $e (i32.const 0) (i32.const 0) (i32.const 4))
    (table.copy $t $t (i32.const 10) (i32.const 0) (i32.const 4))
    (i32.add (table.size $t)
      (i32.add (ref.is_null (table.get $t (i32.const 13)))
        (ref.is_null (table.get $t (i32.const 14))))))

  ;; memory.grow, twice, with no loop.
  (func $grow (export "grow") (result i32)
    (drop (memory.grow (i32.const 1)))
    (drop (memory.grow (i32.const 1)))
    (memory.size)))

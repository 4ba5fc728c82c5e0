;; table_grow: stagehost_run grows its table (no maximum declared) by ten
;; million elements, which would take the host hundreds of MiB: the host
;; caps every table's maximum (stages.MaxTableElements, 1,048,576), so the
;; grow returns -1 and the table is unchanged; growing to exactly the cap
;; works, and one more does not. It returns 0 when all of that holds,
;; else the number of the check that failed (a client error).
(module
  (memory (export "memory") 1 1)
  (table $t 1 funcref)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (if (i32.ne (table.grow $t (ref.null func) (i32.const 10000000)) (i32.const -1))
      (then (return (i32.const 1))))
    (if (i32.ne (table.size $t) (i32.const 1))
      (then (return (i32.const 2))))
    (if (i32.ne (table.grow $t (ref.null func) (i32.const 1048575)) (i32.const 1))
      (then (return (i32.const 3))))
    (if (i32.ne (table.grow $t (ref.null func) (i32.const 1)) (i32.const -1))
      (then (return (i32.const 4))))
    (i32.const 0)))

;; memory_bomb: memory with no declared maximum (the host caps it at its
;; memory limit). stagehost_run grows memory by 16 pages until memory.grow
;; returns -1, touches the last byte of memory, writes the final page count
;; (memory.size, u32 LE) to the output and returns 0.
(module
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (block $done
      (loop $grow
        (br_if $done (i32.eq (memory.grow (i32.const 16)) (i32.const -1)))
        (br $grow)))
    ;; last byte: size*65536-1 (wraps correctly to 0xFFFFFFFF at 65536 pages)
    (i32.store8 (i32.sub (i32.mul (memory.size) (i32.const 65536)) (i32.const 1))
                (i32.const 0xAA))
    (i32.store (i32.const 0) (memory.size))
    (drop (call $output_write (i32.const 0) (i32.const 4)))
    (i32.const 0)))

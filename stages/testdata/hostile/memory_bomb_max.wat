;; memory_bomb_max: declares a memory maximum of 65536 pages (4 GiB), above
;; any sane host memory limit. ABI §1.3: the host must reject it at load
;; (InvalidArgument). The body is memory_bomb's, in case a host caps instead.
(module
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 65536)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (block $done
      (loop $grow
        (br_if $done (i32.eq (memory.grow (i32.const 16)) (i32.const -1)))
        (br $grow)))
    (i32.store8 (i32.sub (i32.mul (memory.size) (i32.const 65536)) (i32.const 1))
                (i32.const 0xAA))
    (i32.store (i32.const 0) (memory.size))
    (drop (call $output_write (i32.const 0) (i32.const 4)))
    (i32.const 0)))

;; snap_state: state that a snapshot captures and that one session's
;; calls change. A data segment puts "init" at 1024; the start function
;; writes "strt" at 1100 and sets the mutable global $g to 7. Each call:
;;
;;   - reads up to 4 input bytes to 2000;
;;   - increments the mutable global $calls;
;;   - with input "G...", grows the memory by one page;
;;   - writes 24 bytes of output: the 4 bytes at 1024 before this call,
;;     the 4 bytes at 1100, $calls, memory.size in pages, $g, and the
;;     i32 at 65536 (the first word of page 1, -1 without one);
;;   - stores the input at 1024 and, when page 1 exists, "page" at 65536;
;;   - with input "T...", then traps.
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (memory (export "memory") 1 4)
  (global $calls (mut i32) (i32.const 0))
  (global $g (mut i32) (i32.const 0))
  (data (i32.const 1024) "init")
  (func $start
    (i32.store (i32.const 1100) (i32.const 0x74727473)) ;; "strt"
    (global.set $g (i32.const 7)))
  (start $start)
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_run") (result i32)
    (i32.store (i32.const 2000) (i32.const 0))
    (drop (call $input_read (i32.const 0) (i32.const 2000) (i32.const 4) (i32.const 2004)))
    (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
    (if (i32.eq (i32.load8_u (i32.const 2000)) (i32.const 71)) ;; 'G'
      (then (drop (memory.grow (i32.const 1)))))
    (i32.store (i32.const 3000) (i32.load (i32.const 1024)))
    (i32.store (i32.const 3004) (i32.load (i32.const 1100)))
    (i32.store (i32.const 3008) (global.get $calls))
    (i32.store (i32.const 3012) (memory.size))
    (i32.store (i32.const 3016) (global.get $g))
    (i32.store (i32.const 3020) (i32.const -1))
    (if (i32.gt_u (memory.size) (i32.const 1))
      (then
        (i32.store (i32.const 3020) (i32.load (i32.const 65536)))
        (i32.store (i32.const 65536) (i32.const 0x65676170)))) ;; "page"
    (drop (call $output_write (i32.const 3000) (i32.const 24)))
    (i32.store (i32.const 1024) (i32.load (i32.const 2000)))
    (if (i32.eq (i32.load8_u (i32.const 2000)) (i32.const 84)) ;; 'T'
      (then (unreachable)))
    (i32.const 0)))

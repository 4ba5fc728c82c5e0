;; loop_init_on_replace_fence: loop_init_on_replace with a fence of its
;; own (stagehost_fence returns 0). After the trap, the instance that must
;; run that fence cannot be made (its init loops), so the host drains with
;; its built-in fence instead (ABI.md §4.3).
;;
;; From loop_init_on_replace: stagehost_run always traps, so every call
;; replaces the instance. stagehost_init returns 0 in the first instance
;; of a session and loops forever in every later one (a replacement).
;;
;; How init tells the first instance from a replacement, through ABI v1
;; alone: named buffers belong to the session, not to the instance. init
;; asks buffer_alloc_named for "booted" with size 2.
;;   - First instance: no buffer has that name, so the call allocates one
;;     and returns OK. init then frees it (which releases the name) and
;;     allocates "booted" again with size 1, and returns 0.
;;   - Any later instance: "booted" is live with size 1, so asking for
;;     size 2 gives INVALID_ARGUMENT (4). init then spins forever.
;; Any other status is a broken fixture: init returns 100 (the probe),
;; 101 (buffer_free) or 102 (the size-1 allocation), which fails the
;; instantiation with a Fault.
;;
;; Memory: 16 "booted", 64 the probe's handle, 72 the kept handle.
(module
  (import "stagehost_v1" "buffer_alloc_named" (func $alloc_named (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_free" (func $buffer_free (param i64) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "booted")
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_init") (result i32)
    (local $st i32)
    (local.set $st (call $alloc_named (i32.const 16) (i32.const 6) (i32.const 2) (i32.const 64)))
    (if (i32.eqz (local.get $st))
      (then
        (if (call $buffer_free (i64.load (i32.const 64)))
          (then (return (i32.const 101))))
        (if (call $alloc_named (i32.const 16) (i32.const 6) (i32.const 1) (i32.const 72))
          (then (return (i32.const 102))))
        (return (i32.const 0))))
    (if (i32.ne (local.get $st) (i32.const 4))
      (then (return (i32.const 100))))
    (loop $spin (br $spin))
    (i32.const 0))
  (func (export "stagehost_fence") (result i32) (i32.const 0))
  (func (export "stagehost_run") (result i32)
    unreachable))

;; hostile.wat: a stage of tenant acme's that launches the hostile vendor
;; PTX kernels of hw/cuda/testdata/vendor (TestServeSuperviseVendorGPU,
;; bench/cuda/vhostile.sh). Input: one byte.
;;   0: stream_sync on stream "s0" only (no kernel): the stage serves;
;;   1: launches vendor kernel "vstore" (store_0x10.ptx: an illegal store,
;;      no args) with grid (1,1,1), block (1,1,1), then syncs;
;;   2: launches vendor kernel "vspin" (spin.ptx: never returns; arg: the
;;      whole buffer "flag"), then syncs.
;; Returns 0; 100+ for a set-up failure; 200+status (launch); 300+status
;; (sync).
;;
;; Rebuild: wat2wasm hostile.wat -o hostile.wasm
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_get" (func $buffer_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_launch" (func $launch (param i64 i64 i32 i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $sync (param i64) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 0) "s0")
  (data (i32.const 8) "vstore")
  (data (i32.const 16) "vspin")
  (data (i32.const 24) "flag")
  ;; 32: input byte; 40: bytes read; 64: stream; 72: program; 80: flag;
  ;; 128: grid (1,1,1); 144: block (1,1,1); 256: one argument record.
  (data (i32.const 128) "\01\00\00\00\01\00\00\00\01\00\00\00")
  (data (i32.const 144) "\01\00\00\00\01\00\00\00\01\00\00\00")
  (func (export "stagehost_abi_v1"))
  (func $go (param $prog i64) (param $nargs i32) (result i32)
    (local $s i32)
    (local.set $s (call $launch (i64.load (i32.const 64)) (local.get $prog) (i32.const 128) (i32.const 144) (i32.const 0) (i32.const 256) (local.get $nargs)))
    (if (local.get $s) (then (return (i32.add (i32.const 200) (local.get $s)))))
    (local.set $s (call $sync (i64.load (i32.const 64))))
    (if (local.get $s) (then (return (i32.add (i32.const 300) (local.get $s)))))
    (i32.const 0))
  (func (export "stagehost_run") (result i32)
    (local $in i32) (local $s i32)
    (if (call $input_read (i32.const 0) (i32.const 32) (i32.const 1) (i32.const 40)) (then (return (i32.const 100))))
    (local.set $in (i32.load8_u (i32.const 32)))
    (if (call $stream_get (i32.const 0) (i32.const 2) (i32.const 64)) (then (return (i32.const 101))))
    (if (i32.eq (local.get $in) (i32.const 1)) (then
      (if (call $program_get (i32.const 8) (i32.const 6) (i32.const 72)) (then (return (i32.const 102))))
      (return (call $go (i64.load (i32.const 72)) (i32.const 0)))))
    (if (i32.eq (local.get $in) (i32.const 2)) (then
      (if (call $program_get (i32.const 16) (i32.const 5) (i32.const 72)) (then (return (i32.const 103))))
      (if (call $buffer_get (i32.const 24) (i32.const 4) (i32.const 80)) (then (return (i32.const 104))))
      ;; flag: the whole buffer (kind 1, offset 0, length to the end)
      (i32.store (i32.const 256) (i32.const 1))
      (i32.store (i32.const 264) (i32.const -1))
      (i64.store (i32.const 272) (i64.load (i32.const 80)))
      (return (call $go (i64.load (i32.const 72)) (i32.const 1)))))
    (local.set $s (call $sync (i64.load (i32.const 64))))
    (if (local.get $s) (then (return (i32.add (i32.const 300) (local.get $s)))))
    (i32.const 0)))

;; fence_sync_status: a fence module (load it with kind FenceModule). Its
;; stagehost_fence looks up s0, the session's only stream, syncs it and
;; returns the status stream_sync gave: 0 when the work retired cleanly,
;; FAULT (9) when it drained but a command had failed on the device. That
;; is an honest fence: FAULT means "drained, but device work failed", so
;; the session is not quarantined and the call fails with Fault.
;;
;; Memory: 16 "s0", 64 stream handle. If stream_get fails the fence
;; returns 100, which is a failed fence (a broken fixture).
(module
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (memory (export "memory") 1 1)
  (data (i32.const 16) "s0")
  (func (export "stagehost_abi_v1"))
  (func (export "stagehost_fence") (result i32)
    (if (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64))
      (then (return (i32.const 100))))
    (call $stream_sync (i64.load (i32.const 64)))))

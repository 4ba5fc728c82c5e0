;; last_error: exercises last_error (ABI.md §3). Input byte 0 picks what
;; it does; it writes to the output, as little-endian u32 values, a status
;; word (the result of a host call) or a length word (the u32 at 128, set
;; to 0xAAAAAAAA before each last_error) at each step, and the message
;; bytes where said. A failing setup step returns client error 100 + step.
;;
;; 0 (or no input): last_error(1024, 4096): status, length word, message.
;; 1: launches saxpy(2.0, x, y) with x of 4 float32 values and y of 2,
;;    then: the stream_sync status (FAULT);
;;    last_error(1024, cap 8): status, length word, and the 8 bytes at
;;    1024 (set to 0xBB before: a destination too small gets the length
;;    only);
;;    last_error(1024, cap 4096): status, length word, message.
;; 2: program_get("nope"): status (NOT_FOUND); input_size: status (OK);
;;    last_error with a destination outside memory: status, length word;
;;    last_error with the length pointer outside memory: status;
;;    last_error(1024, 4096): status, length word, message (still the
;;    NOT_FOUND's: neither an OK status nor last_error's own failures
;;    change it).
;; 3: launches the same saxpy, then stream_read of 4 bytes of y into 1024
;;    instead of a stream_sync: the read's status; then returns 0 (OK),
;;    ignoring it.
;; 4: stream_read of 4 bytes of a new 16-byte buffer into 1024: the
;;    read's status; then returns 0 (OK), ignoring it.
(module
  (import "stagehost_v1" "input_read" (func $input_read (param i32 i32 i32 i32) (result i32)))
  (import "stagehost_v1" "input_size" (func $input_size (param i32) (result i32)))
  (import "stagehost_v1" "output_write" (func $output_write (param i32 i32) (result i32)))
  (import "stagehost_v1" "last_error" (func $last_error (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_get" (func $stream_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "program_get" (func $program_get (param i32 i32 i32) (result i32)))
  (import "stagehost_v1" "buffer_alloc" (func $buffer_alloc (param i32 i32) (result i32)))
  (import "stagehost_v1" "stream_submit" (func $stream_submit (param i64 i64 i32 i32) (result i32)))
  (import "stagehost_v1" "stream_sync" (func $stream_sync (param i64) (result i32)))
  (import "stagehost_v1" "stream_read" (func $stream_read (param i64 i64 i32 i32 i32) (result i32)))
  (memory (export "memory") 1 1)
  ;; 0: input byte, 4: input count, 16: "s0", 32: "saxpy", 48: "nope",
  ;; 64: stream, 72: program, 80: x, 88: y (handles), 96: status word,
  ;; 128: length word, 136: input size, 256: argument records,
  ;; 1024: message.
  (data (i32.const 16) "s0")
  (data (i32.const 32) "saxpy")
  (data (i32.const 48) "nope")
  (func (export "stagehost_abi_v1"))
  (func $emit (param $status i32)
    (i32.store (i32.const 96) (local.get $status))
    (drop (call $output_write (i32.const 96) (i32.const 4))))
  (func $emit_len
    (drop (call $output_write (i32.const 128) (i32.const 4))))
  (func $reset
    (i32.store (i32.const 128) (i32.const 0xAAAAAAAA))
    (memory.fill (i32.const 1024) (i32.const 0xBB) (i32.const 16)))
  ;; last_error(1024, 4096): status, length word, message
  (func $emit_message
    (call $reset)
    (call $emit (call $last_error (i32.const 1024) (i32.const 4096) (i32.const 128)))
    (call $emit_len)
    (if (i32.le_u (i32.load (i32.const 128)) (i32.const 4096))
      (then (drop (call $output_write (i32.const 1024) (i32.load (i32.const 128)))))))
  (func $buffer_record (param $at i32) (param $handle i64)
    (i32.store (local.get $at) (i32.const 1))
    (i32.store offset=4 (local.get $at) (i32.const 0))
    (i32.store offset=8 (local.get $at) (i32.const 0xFFFFFFFF))
    (i32.store offset=12 (local.get $at) (i32.const 0))
    (i64.store offset=16 (local.get $at) (local.get $handle)))
  (func $bad_saxpy (result i32)
    (local $r i32)
    (if (local.tee $r (call $submit_bad_saxpy)) (then (return (local.get $r))))
    (call $emit (call $stream_sync (i64.load (i32.const 64))))
    (call $reset)
    (call $emit (call $last_error (i32.const 1024) (i32.const 8) (i32.const 128)))
    (call $emit_len)
    (drop (call $output_write (i32.const 1024) (i32.const 8)))
    (call $emit_message)
    (i32.const 0))
  (func $bad_saxpy_read (result i32)
    (local $r i32)
    (if (local.tee $r (call $submit_bad_saxpy)) (then (return (local.get $r))))
    (call $emit (call $stream_read (i64.load (i32.const 64)) (i64.load (i32.const 88)) (i32.const 0) (i32.const 1024) (i32.const 4)))
    (i32.const 0))
  (func $read_only (result i32)
    (if (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64)) (then (return (i32.const 101))))
    (if (call $buffer_alloc (i32.const 16) (i32.const 88)) (then (return (i32.const 104))))
    (call $emit (call $stream_read (i64.load (i32.const 64)) (i64.load (i32.const 88)) (i32.const 0) (i32.const 1024) (i32.const 4)))
    (i32.const 0))
  (func $submit_bad_saxpy (result i32)
    (if (call $stream_get (i32.const 16) (i32.const 2) (i32.const 64)) (then (return (i32.const 101))))
    (if (call $program_get (i32.const 32) (i32.const 5) (i32.const 72)) (then (return (i32.const 102))))
    (if (call $buffer_alloc (i32.const 16) (i32.const 80)) (then (return (i32.const 103))))
    (if (call $buffer_alloc (i32.const 8) (i32.const 88)) (then (return (i32.const 104))))
    ;; a = 2.0, x, y
    (i32.store (i32.const 256) (i32.const 0))
    (i32.store (i32.const 260) (i32.const 0))
    (i32.store (i32.const 264) (i32.const 0))
    (i32.store (i32.const 268) (i32.const 0))
    (i64.store (i32.const 272) (i64.const 0x40000000))
    (call $buffer_record (i32.const 280) (i64.load (i32.const 80)))
    (call $buffer_record (i32.const 304) (i64.load (i32.const 88)))
    (if (call $stream_submit (i64.load (i32.const 64)) (i64.load (i32.const 72)) (i32.const 256) (i32.const 3))
      (then (return (i32.const 105))))
    (i32.const 0))
  (func $not_found (result i32)
    (call $emit (call $program_get (i32.const 48) (i32.const 4) (i32.const 72)))
    (call $emit (call $input_size (i32.const 136)))
    (call $reset)
    (call $emit (call $last_error (i32.const 0xFFFFFF00) (i32.const 64) (i32.const 128)))
    (call $emit_len)
    (call $emit (call $last_error (i32.const 1024) (i32.const 64) (i32.const 0xFFFFFFFE)))
    (call $emit_message)
    (i32.const 0))
  (func (export "stagehost_run") (result i32)
    (i32.store8 (i32.const 0) (i32.const 0))
    (if (call $input_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 4))
      (then (return (i32.const 100))))
    (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 1))
      (then (return (call $bad_saxpy))))
    (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 2))
      (then (return (call $not_found))))
    (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 3))
      (then (return (call $bad_saxpy_read))))
    (if (i32.eq (i32.load8_u (i32.const 0)) (i32.const 4))
      (then (return (call $read_only))))
    (call $emit_message)
    (i32.const 0)))

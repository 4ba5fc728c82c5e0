;; Adds an f32 to an i32: every opcode is allowed, but the body does not
;; validate (the types on the operand stack), which the engine finds when
;; it compiles the module. Built with wat2wasm --no-check.
(module
  (memory (export "memory") 1)
  (func (export "double") (param i32 i32 i32 i32 i32)
    (drop (i32.add (local.get 0) (f32.const 1)))))

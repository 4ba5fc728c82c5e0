// Package b is imported by package a.
package b

// T is a type with a method and a field.
type T struct {
	// F is a field.
	F int
}

// M is a method of T.
func (T) M() {}

// I is an interface.
type I interface {
	// Do is an interface method.
	Do()
}

// Const is a constant.
const Const = 1

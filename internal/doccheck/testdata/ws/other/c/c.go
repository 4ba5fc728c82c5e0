// Package c is in another module of the workspace.
package c

// Exported is a function.
func Exported() {}

// Package x is skipped: [Missing].
package x

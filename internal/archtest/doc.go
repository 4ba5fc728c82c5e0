// Package archtest holds the test that keeps stagehost's imports flowing
// one way (ARCHITECTURE.md): it has no code of its own.
package archtest

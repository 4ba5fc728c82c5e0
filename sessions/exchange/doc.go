// Package exchange holds the participants of a resident session (package
// sessions): a GPU and an NPU side that run a credit ping-pong over a
// shared payload of [PayloadSize] bytes, on the sim backend
// ([NewSimExchange], whose programs it registers with hw/sim when it is
// imported) and on the CUDA backend ([NewCUDAExchange]: a kernel of
// hw/cuda's module and a host program it registers with
// cuda.RegisterHostProgram). [ExchangeData] reads a payload's result and
// [ExpectedPayload] computes it in plain Go.
//
// Importing this package is what registers those programs: package
// sessions itself imports no backend (ARCHITECTURE.md), so a program that
// runs resident sessions imports this package (package deploy does).
package exchange

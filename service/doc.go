// Package service is stagehost's HTTP service over a [deploy.Deployment]
// (docs/service.md): the [Server] with its routes (session runs, resident
// starts and reads, model control, the lattice's and a supervisor's
// routes), bearer-token scopes, health and readiness, metrics, the status
// page, request ids and traces, and the listener limit. errors.go maps
// every error to its class and every class to its HTTP status
// (errdefs.HTTPStatus); nothing else in the service decides a status.
//
// The lattice (package internal/lattice) and a supervisor's workers
// (internal/supervise) reach it through the [Lattice] and [Workers]
// interfaces, which return typed records; [JoinLattice],
// [SupervisorFront] and [SupervisorWorkers] wire them for `stagehost
// serve`, translating the manifest's tables into those packages' own
// configuration ([LatticeConfig]). The import order is in ARCHITECTURE.md.
package service

// Package modelctl is model control under `serve --supervise`: the
// supervisor's admin routes (module loads and uploads, unloads, swaps,
// resets) reach the workers over the lattice's NATS connection, and the
// model state those routes change (uploaded modules, swaps) is kept in a
// [Store] and restored when a worker or the supervisor starts again.
//
// The wire: each worker subscribes to [Subject] (its host id's), and
// answers a JSON [Request] with a JSON [Reply]; an error answer carries
// the error's class and message (errdefs' wire names), so that the
// supervisor answers with the status the worker's refusal has in a
// single process. A load carries no bytes: the supervisor puts them in
// the store first ([Store.PutBlob], keyed by sha256), and each worker
// reads them from there ([Store.Blob]) and checks their sha256.
//
// The state: [Dir] keeps it on disk (docs/service.md, "Model state"),
// written by the supervisor alone; [Restore] re-applies it to a worker's
// deployment before the worker joins the lattice. A KV-backed store (a
// lattice's) implements the same four methods.
package modelctl

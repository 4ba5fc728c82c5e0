package hw

// BatchSubmitter is implemented by streams that can take several launches
// in one hand-off. It is optional: callers check for it with a type
// assertion and otherwise submit the commands one by one.
//
//	if b, ok := stream.(hw.BatchSubmitter); ok {
//		done, err := b.SubmitBatch(cmds)
//		...
//	}
//
// SubmitBatch validates every command exactly as [Stream.Submit] would,
// and enqueues nothing unless all are valid. It then enqueues all of them,
// in order and contiguously (no other submission on the stream lands
// between two of them), and returns one [Completion] that retires when the
// last one has, carrying the first failure among them. An empty batch
// returns the zero Completion. Like Submit, it copies the commands, so the
// caller may reuse cmds (and their Args) at once.
//
// # Errors
//
// Those of [Stream.Submit], naming the command's index for a validation
// failure; [errdefs.ErrBusy] when the stream cannot take the whole batch now
// (nothing was enqueued).
type BatchSubmitter interface {
	SubmitBatch(cmds []Command) (Completion, error)
}

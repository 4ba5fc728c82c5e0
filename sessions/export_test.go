package sessions

import "github.com/stagehost/stagehost/hw"

// What the external tests (package sessions_test, which the exchange
// participants of package sessions/exchange need) reach inside.

// Publication is st's prepared visibility actions: the GPU's, then the
// NPU's.
func Publication(st *ResidentStartup) [2]hw.VisibilityAction { return st.publication }

// Publish publishes a decision on st's line.
func Publish(st *ResidentStartup, decision uint32) error { return st.publish(decision) }

// DecisionName names a startup decision.
func DecisionName(v uint32) string { return decisionName(v) }

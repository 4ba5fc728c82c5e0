package lattice

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// maxCallClaimTTL caps how long a call claim is kept (a call whose
// deadline is further away keeps its claim this long).
const maxCallClaimTTL = time.Hour

// callClaimMargin is kept past a call's deadline in its claim: the
// clock-skew allowance between the hosts (docs/lattice.md, "Delivery").
const callClaimMargin = time.Second

// callClaims is the lattice's calls bucket: a host that must claim a
// call before it starts it (a call sent again, or one older than its
// acknowledgement window) creates the call's id there; of several hosts
// holding copies of one call, only the one whose Create succeeded runs it.
type callClaims struct {
	kv jetstream.KeyValue
}

// openCalls opens (creating it if needed) a lattice's calls bucket: in
// memory, each key with its own TTL (the call's deadline plus
// callClaimMargin).
func openCalls(ctx context.Context, js jetstream.JetStream, lattice string, replicas int) (*callClaims, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: CallsBucket(lattice), Description: "stagehost lattice " + lattice + ": call ids claimed by the host that runs them",
		History: 1, TTL: maxCallClaimTTL, LimitMarkerTTL: time.Second, Storage: jetstream.MemoryStorage, Replicas: max(replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("lattice: calls bucket: %w", err)
	}
	return &callClaims{kv: kv}, nil
}

// errClaimedElsewhere: another host claimed the call id first.
var errClaimedElsewhere = errors.New("lattice: the call was claimed by another host")

// claim creates id for host, kept until deadline plus callClaimMargin.
// It returns the claim's revision, errClaimedElsewhere when the id
// exists, or the store's error.
func (c *callClaims) claim(ctx context.Context, id, host string, deadline time.Time) (uint64, error) {
	ttl := min(max(time.Until(deadline)+callClaimMargin, time.Second), maxCallClaimTTL)
	// The value names the host and this attempt: a copy of the call this
	// host took earlier holds another, and is not taken for this one.
	value := host + " " + nuid.Next()
	for {
		// One attempt within claimAttempt: while the bucket's stream has
		// no leader (a node of the cluster was lost) a request may get
		// no answer; another is sent, until ctx (the call's deadline)
		// ends. A Create that reached the stream and whose answer was
		// lost fails again with ErrKeyExists, the key holding this
		// host's id: that is this host's claim.
		actx, cancel := context.WithTimeout(ctx, claimAttempt)
		rev, err := c.kv.Create(actx, id, []byte(value), jetstream.KeyTTL(ttl))
		cancel()
		if errors.Is(err, jetstream.ErrKeyExists) {
			return c.owned(ctx, id, value)
		}
		if err == nil || ctx.Err() != nil || !retryable(err) {
			return rev, err
		}
		if !sleepCtx(ctx, claimRetry) {
			return 0, ctx.Err()
		}
	}
}

// owned reads a claim that exists: its revision when it holds value
// (this attempt made it, and its answer was lost), else
// errClaimedElsewhere.
func (c *callClaims) owned(ctx context.Context, id, value string) (uint64, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, claimAttempt)
		e, err := c.kv.Get(actx, id)
		cancel()
		switch {
		case err == nil && string(e.Value()) == value:
			return e.Revision(), nil
		case err == nil, errors.Is(err, jetstream.ErrKeyNotFound):
			return 0, errClaimedElsewhere
		case ctx.Err() != nil || !retryable(err):
			return 0, err
		}
		if !sleepCtx(ctx, claimRetry) {
			return 0, ctx.Err()
		}
	}
}

// retryable: a JetStream request that failed for want of a stream
// leader or an answer, not because of what it asked.
func retryable(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrConnectionDraining) ||
		isJSUnavailable(err)
}

// isJSUnavailable: JetStream answered that the stream or the cluster is
// unavailable for now (503, no leader, no quorum).
func isJSUnavailable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == 503
}

// release deletes a claim this host holds (revision rev), so that a
// copy of the call sent again may be claimed by another host: for a call
// that ran nowhere (NotRunHeader).
func (c *callClaims) release(id string, rev uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.kv.Delete(ctx, id, jetstream.LastRevision(rev))
}

// unixNanoHeader formats t for DeadlineAtHeader and ClaimAfterHeader.
func unixNanoHeader(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// callTerms are what a host reads of a call's headers before it takes
// it: its id, its absolute deadline, and from when it must claim it.
type callTerms struct {
	id       string
	deadline time.Time // zero: none
	// claimAfter: the call must be claimed before it starts at or after
	// this time; claimAlways: whenever it starts; neither without
	// ClaimAfterHeader (a request that is never sent again).
	claimAfter  time.Time
	claimAlways bool
	claims      bool // ClaimAfterHeader present with a call id
}

// readTerms reads a call's terms from its headers, arrived at arrival:
// DeadlineAtHeader (Unix nanoseconds), else DeadlineHeader (a duration
// from arrival); CallIDHeader; ClaimAfterHeader.
func readTerms(hdr nats.Header, arrival time.Time) (callTerms, error) {
	t := callTerms{id: hdr.Get(CallIDHeader)}
	if v := hdr.Get(DeadlineAtHeader); v != "" {
		ns, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ns <= 0 {
			return t, fmt.Errorf("%s: %q is not a positive count of Unix nanoseconds", DeadlineAtHeader, v)
		}
		t.deadline = time.Unix(0, ns)
	} else if v := hdr.Get(DeadlineHeader); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return t, fmt.Errorf("%s: %q is not a positive duration (for example 250ms)", DeadlineHeader, v)
		}
		t.deadline = arrival.Add(d)
	}
	if v := hdr.Get(ClaimAfterHeader); v != "" {
		if t.id == "" || !jetstreamKeyValid(t.id) {
			return t, fmt.Errorf("%s: %q is not a call id (letters, digits, '-', '_', '=', '.', '/')", CallIDHeader, t.id)
		}
		ns, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ns < 0 {
			return t, fmt.Errorf("%s: %q is not a count of Unix nanoseconds", ClaimAfterHeader, v)
		}
		t.claims = true
		if ns == 0 {
			t.claimAlways = true
		} else {
			t.claimAfter = time.Unix(0, ns)
		}
	}
	return t, nil
}

// mustClaim says whether a call starting at now must be claimed first.
func (t callTerms) mustClaim(now time.Time) bool {
	return t.claims && (t.claimAlways || !now.Before(t.claimAfter))
}

// jetstreamKeyValid: a KV key (and a call id) is letters, digits and
// "-_=./", not starting or ending with '.'.
func jetstreamKeyValid(k string) bool {
	if k == "" || k[0] == '.' || k[len(k)-1] == '.' || len(k) > 256 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '=' || c == '.' || c == '/') {
			return false
		}
	}
	return true
}

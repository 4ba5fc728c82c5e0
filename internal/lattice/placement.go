package lattice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrClaimed is returned by [Claims.Claim] when another owner holds the
// key, and by Renew and Release when the claim was lost.
var ErrClaimed = errors.New("lattice: placement is claimed by another owner")

// Claims are exclusive placement keys (PlacementBucket, key e.g.
// "placement.<session>"), won by KV compare-and-swap: Claim creates the
// key only if it does not exist, Renew and Release act only on the
// revision the owner holds. Two owners can never both hold a key. The
// bucket has a TTL: a claim its owner stops renewing expires.
type Claims struct {
	kv jetstream.KeyValue
}

// Claim is one held placement.
type Claim struct {
	Key      string    `json:"-"`
	Owner    string    `json:"owner"`
	At       time.Time `json:"at"`
	Revision uint64    `json:"-"`
}

// OpenClaims opens (creating it if needed) a lattice's placement bucket;
// ttl is how long an unrenewed claim lasts (0: until released).
func OpenClaims(ctx context.Context, js jetstream.JetStream, lattice string, ttl time.Duration, replicas int) (*Claims, error) {
	if err := checkName("lattice", lattice); err != nil {
		return nil, err
	}
	cfg := jetstream.KeyValueConfig{Bucket: PlacementBucket(lattice), History: 1, TTL: ttl, Replicas: max(replicas, 1),
		Description: "stagehost lattice " + lattice + ": placement claims", Storage: jetstream.FileStorage}
	if ttl > 0 {
		// Limit markers make an expired claim visible to watchers (hosts
		// standing by claim it at once).
		cfg.LimitMarkerTTL = max(ttl, time.Second)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("lattice: placement bucket: %w", err)
	}
	return &Claims{kv: kv}, nil
}

// PlacementKey is the placement key of a session.
func PlacementKey(session string) string { return "placement." + session }

// Claim claims key for owner. Exactly one of several owners racing wins;
// the others get an error wrapping [ErrClaimed] that names the holder.
func (c *Claims) Claim(ctx context.Context, key, owner string) (*Claim, error) {
	cl := &Claim{Key: key, Owner: owner, At: time.Now().UTC()}
	b, _ := json.Marshal(cl)
	rev, err := c.kv.Create(ctx, key, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		holder := "?"
		if h, gerr := c.Get(ctx, key); gerr == nil {
			holder = h.Owner
		}
		return nil, fmt.Errorf("%w: %s is held by %s", ErrClaimed, key, holder)
	}
	if err != nil {
		return nil, fmt.Errorf("lattice: claiming %s: %w", key, err)
	}
	cl.Revision = rev
	return cl, nil
}

// Get reads the claim of key as it is now, with its revision: who
// holds it. The error wraps jetstream.ErrKeyNotFound when no one does.
func (c *Claims) Get(ctx context.Context, key string) (*Claim, error) {
	e, err := c.kv.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("lattice: reading the claim %s: %w", key, err)
	}
	var cl Claim
	if err := json.Unmarshal(e.Value(), &cl); err != nil {
		return nil, fmt.Errorf("lattice: the claim %s: %w", key, err)
	}
	cl.Key, cl.Revision = e.Key(), e.Revision()
	return &cl, nil
}

// Renew refreshes a held claim (its TTL starts again), if it is still the
// revision the owner holds.
func (c *Claims) Renew(ctx context.Context, cl *Claim) error {
	cl.At = time.Now().UTC()
	b, _ := json.Marshal(cl)
	rev, err := c.kv.Update(ctx, cl.Key, b, cl.Revision)
	if err != nil {
		return fmt.Errorf("%w: renewing %s: %v", ErrClaimed, cl.Key, err)
	}
	cl.Revision = rev
	return nil
}

// Release gives a held claim up, if it is still the revision the owner
// holds.
func (c *Claims) Release(ctx context.Context, cl *Claim) error {
	if err := c.kv.Delete(ctx, cl.Key, jetstream.LastRevision(cl.Revision)); err != nil {
		return fmt.Errorf("%w: releasing %s: %v", ErrClaimed, cl.Key, err)
	}
	return nil
}

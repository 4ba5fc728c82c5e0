package lattice

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PayloadHeader, on a request or an answer, names the object in the
// lattice's payload store ([PayloadsBucket]) that holds the call's input
// or output instead of the message body, which is then empty: used for a
// payload that one NATS message cannot carry (see [PayloadHeadroom]).
const PayloadHeader = "Stagehost-Payload"

// PayloadTTL is how long the payload store keeps an object. The front
// deletes an input once the call ended, however it ended (a call sent
// again reads it again); an output once read, or as soon as its answer
// reaches it with no call waiting; the host that stored an output
// deletes it [OutputKeep] after its answer. The TTL only removes an
// input whose front died during the call, and an output whose host died
// within OutputKeep of answering to a front that died too.
const PayloadTTL = time.Hour

// OutputKeep is how long after its answer the host that stored a call's
// output deletes it, whether or not the front read it. The front deletes
// the object as soon as it has read it, or as soon as the answer reaches
// it with no call waiting (the client went away, the deadline and the
// front's grace passed); OutputKeep removes the object of an answer that
// reached no front (the front died or lost its connection). A front
// reads an output within payloadTimeout of receiving its answer, which
// it takes only until the call's deadline plus its grace: one minute
// leaves room for both.
const OutputKeep = time.Minute

// PayloadsBucket names a lattice's payload store, a JetStream object
// store.
func PayloadsBucket(lattice string) string { return "stagehost-" + lattice + "-payloads" }

// payloadTimeout bounds a payload store operation that runs without the
// call's own deadline: storing an output, reading it back, a deletion.
const payloadTimeout = 30 * time.Second

// payloads is a lattice's payload store, as one connection sees it.
type payloads struct {
	nc     *nats.Conn
	obs    jetstream.ObjectStore
	stream jetstream.Stream // the object store's stream
	bucket string
	max    int64 // the store's MaxBytes; 0 for none
}

func openPayloads(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, lattice string, replicas int, maxBytes int64) (*payloads, error) {
	if maxBytes < 0 {
		maxBytes = 0
	}
	obs, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: PayloadsBucket(lattice), Description: "stagehost lattice " + lattice + ": inputs and outputs too large for one message",
		TTL: PayloadTTL, Storage: jetstream.FileStorage, Replicas: max(replicas, 1), MaxBytes: maxBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("lattice: payload store: %w", err)
	}
	bucket := PayloadsBucket(lattice)
	stream, err := js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return nil, fmt.Errorf("lattice: payload store: %w", err)
	}
	return &payloads{nc: nc, obs: obs, stream: stream, bucket: bucket, max: maxBytes}, nil
}

// overStoreLimit is put's error for a payload larger than the whole
// store (payload_store_max): it can never be stored.
type overStoreLimit struct{ size, limit int64 }

func (e *overStoreLimit) Error() string {
	return fmt.Sprintf("%d bytes is more than the lattice's payload store holds (payload_store_max %d bytes)", e.size, e.limit)
}

// storeFull is put's error for a payload that does not fit beside the
// objects the store holds now.
type storeFull struct {
	size, limit int64
	err         error
}

func (e *storeFull) Error() string {
	return fmt.Sprintf("the lattice's payload store is full: %d bytes do not fit beside the objects it holds (payload_store_max %d bytes): %v", e.size, e.limit, e.err)
}

func (e *storeFull) Unwrap() error { return e.err }

// fits says whether n bytes of payload fit in one message, with
// PayloadHeadroom left for its headers.
func (p *payloads) fits(n int) bool {
	limit := p.nc.MaxPayload()
	return limit <= 0 || int64(n)+PayloadHeadroom <= limit
}

// put stores data as a new object and returns its name. The object's
// chunks are at most what one message carries (and at most 1 MiB).
func (p *payloads) put(ctx context.Context, data []byte) (string, error) {
	chunk := 1 << 20
	if limit := p.nc.MaxPayload() - PayloadHeadroom; limit > 0 && limit < int64(chunk) {
		chunk = int(limit)
	}
	if p.max > 0 && int64(len(data)) > p.max {
		return "", &overStoreLimit{size: int64(len(data)), limit: p.max}
	}
	name := rand.Text()
	if _, err := p.obs.Put(ctx, jetstream.ObjectMeta{Name: name, Opts: &jetstream.ObjectMetaOptions{ChunkSize: uint32(chunk)}}, bytes.NewReader(data)); err != nil {
		// A failed Put purges the chunks it stored, but a failure seen
		// once its meta message was sent leaves that: purged too.
		p.remove(name)
		if isMaxBytes(err) {
			return "", &storeFull{size: int64(len(data)), limit: p.max, err: err}
		}
		return "", err
	}
	return name, nil
}

// maxPayloadObject bounds the size an object's info may claim (a call's
// input is at most 4 GiB, max_input's limit).
const maxPayloadObject = 4 << 30

// tooLarge is get's error for an object larger than its limit.
type tooLarge struct{ size uint64 }

func (e *tooLarge) Error() string {
	return fmt.Sprintf("the object holds %d bytes, more than its limit", e.size)
}

// get reads an object of at most limit bytes (else a *tooLarge, before
// reading it), into one buffer of the size its info gives, and to its
// end, where the object store checks its SHA-256 digest; a missing
// object is errPayloadGone. (GetBytes would grow a buffer as it reads:
// a third of the CPU time of a 9 MiB call, profiled.)
func (p *payloads) get(ctx context.Context, name string, limit int64) ([]byte, error) {
	r, err := p.obs.Get(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, errPayloadGone
	}
	if err != nil {
		return nil, err
	}
	defer r.Close()
	info, err := r.Info()
	if err != nil {
		return nil, err
	}
	if info.Size > uint64(min(limit, maxPayloadObject)) {
		return nil, &tooLarge{size: info.Size}
	}
	b := make([]byte, info.Size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("object %s: %w", name, err)
	}
	var more [1]byte
	for {
		n, err := r.Read(more[:])
		if n > 0 {
			return nil, fmt.Errorf("object %s is longer than its %d bytes", name, info.Size)
		}
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, fmt.Errorf("object %s: %w", name, err)
		}
	}
}

// remove deletes an object, within payloadTimeout; it reports nothing
// (the TTL removes what a failed deletion leaves). It purges the
// object's messages from the store's stream (its chunks, then its meta
// message; the object store's layout, ADR-20) instead of the object
// store's Delete, which first writes a deletion marker: in a store at
// its MaxBytes that write is refused, and nothing would be freed.
func (p *payloads) remove(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), payloadTimeout)
	defer cancel()
	if info, err := p.obs.GetInfo(ctx, name, jetstream.GetObjectInfoShowDeleted()); err == nil && info.NUID != "" {
		_ = p.stream.Purge(ctx, jetstream.WithPurgeSubject("$O."+p.bucket+".C."+info.NUID))
	}
	_ = p.stream.Purge(ctx, jetstream.WithPurgeSubject("$O."+p.bucket+".M."+base64.URLEncoding.EncodeToString([]byte(name))))
}

var errPayloadGone = errors.New("not in the lattice's payload store (deleted, or past its TTL)")

// jsErrMaxBytes is the JetStream error code of a message refused because
// its stream is at MaxBytes (the server's JSStreamStoreFailedF family:
// "maximum bytes exceeded").
const jsErrMaxBytes = 10077

// isMaxBytes says whether a store operation failed because the stream
// reached its MaxBytes (a refused chunk; the object store purged the
// chunks it had put).
func isMaxBytes(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrMaxBytes {
		return true
	}
	return errors.Is(err, jetstream.ErrMaxBytesExceeded) || strings.Contains(err.Error(), "maximum bytes exceeded")
}

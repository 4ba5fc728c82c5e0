package abi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/stagehost/stagehost/errdefs"
)

// Declared requirements (ABI.md §7): a module may carry a Wasm custom
// section named [RequiresSection] whose payload is a JSON document that
// says what the module needs from the session that runs it and from the
// host. The host reads it at load and checks it wherever the module
// meets a session, so that a module the session cannot serve is refused
// there, with every missing item named, and never fails in its first
// call instead.

// RequiresSection is the name of the custom section that holds a
// module's requirements.
const RequiresSection = "stagehost.requires"

// RequiresVersion is the only version of the requirements document this
// package reads.
const RequiresVersion = 1

// Bounds of a requirements section.
const (
	MaxRequiresSize  = 64 << 10 // bytes of the section's payload
	MaxRequiresItems = 1024     // names, tensors and shape dimensions, counted together
	maxNameLen       = 128      // bytes of a program, stream, weights or tensor name
	// A declared tensor has at most MaxTensorRank (abi.go) dimensions,
	// as many as a tensor_get record holds.
)

// Requires is a module's declared requirements: the JSON document of its
// [RequiresSection]. The zero value requires nothing. Every list is
// sorted as the module wrote it; names in a list are distinct.
type Requires struct {
	Version        int          `json:"version"`                    // RequiresVersion
	ABIRevision    int          `json:"abi_revision,omitempty"`     // the lowest host revision of v1 it runs on (0: any, as 1)
	Programs       []string     `json:"programs,omitempty"`         // device programs the session must list (manifest programs)
	Streams        []string     `json:"streams,omitempty"`          // streams the session must have (manifest streams)
	Weights        []string     `json:"weights,omitempty"`          // weights the session must list (manifest weights)
	MinBudgetBytes int64        `json:"min_budget_bytes,omitempty"` // the least device-memory budget the session may give it
	WASI           []string     `json:"wasi,omitempty"`             // WASI grants it must be loaded with ("wasi": true is ["go-runtime"])
	Inputs         []TensorSpec `json:"inputs,omitempty"`           // its input, as tensors (the Open Inference Protocol's)
	Outputs        []TensorSpec `json:"outputs,omitempty"`          // its output, as tensors
}

// TensorSpec declares one input or output tensor: a name, an Open
// Inference Protocol datatype (FP32, INT32, …: [DatatypeSize]) and a
// shape whose dimensions are sizes, or -1 for a free one.
type TensorSpec struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

// datatypeSizes gives the element size in bytes of every datatype a
// tensor may declare: the Open Inference Protocol's, but BYTES (whose
// elements have no fixed size).
var datatypeSizes = map[string]int{
	"BOOL": 1, "UINT8": 1, "INT8": 1,
	"UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2,
	"UINT32": 4, "INT32": 4, "FP32": 4,
	"UINT64": 8, "INT64": 8, "FP64": 8,
}

// Datatypes lists the datatypes a declared tensor may have, in a fixed
// order.
var Datatypes = []string{"BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BF16"}

// DatatypeSize returns the size in bytes of one element of datatype dt,
// 0 for a datatype no tensor may declare (BYTES, or an unknown name).
func DatatypeSize(dt string) int { return datatypeSizes[dt] }

// MaxDim is the largest size of one dimension of a declared tensor.
const MaxDim = 1 << 40

var weightsNameRE = regexp.MustCompile(`^[a-z0-9_.-]{1,64}$`)

// rawRequires is the document as decoded, before its checks; WASI may be
// a boolean or a list.
type rawRequires struct {
	Version        *int            `json:"version"`
	ABIRevision    int             `json:"abi_revision"`
	Programs       []string        `json:"programs"`
	Streams        []string        `json:"streams"`
	Weights        []string        `json:"weights"`
	MinBudgetBytes int64           `json:"min_budget_bytes"`
	WASI           json.RawMessage `json:"wasi"`
	Inputs         []TensorSpec    `json:"inputs"`
	Outputs        []TensorSpec    `json:"outputs"`
}

// ParseRequires reads a requirements document strictly: a JSON object of
// at most [MaxRequiresSize] bytes with "version": 1, no key but those of
// [Requires], no duplicate name in a list, at most [MaxRequiresItems]
// items, valid names, datatypes and shapes, and nothing after the object.
//
// # Errors
//
// [errdefs.ErrInvalidArgument], naming the field ("stagehost.requires:
// programs[2]: …") or the byte offset of a JSON syntax error.
func ParseRequires(doc []byte) (*Requires, error) {
	fail := func(format string, args ...any) (*Requires, error) {
		return nil, errdefs.Errorf(errdefs.ErrInvalidArgument, RequiresSection+": "+format, args...)
	}
	if len(doc) > MaxRequiresSize {
		return fail("%d bytes, more than the limit of %d", len(doc), MaxRequiresSize)
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.DisallowUnknownFields()
	var raw rawRequires
	if err := dec.Decode(&raw); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return fail("not JSON: %v (at byte %d)", se, se.Offset)
		case errors.As(err, &te) && te.Field == "":
			return fail("a JSON %s where an object is wanted", te.Value)
		case errors.As(err, &te):
			return fail("%s: a JSON %s where %s is wanted", te.Field, te.Value, jsonKind(te.Type.String()))
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return fail("not JSON: the document ends early")
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			return fail("unknown key %s (known: version, abi_revision, programs, streams, weights, min_budget_bytes, wasi, inputs, outputs)",
				strings.TrimPrefix(err.Error(), "json: unknown field "))
		}
		return fail("%v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fail("data after the JSON object (at byte %d)", dec.InputOffset())
	}
	if raw.Version == nil {
		return fail("version: required key is missing (want %d)", RequiresVersion)
	}
	if *raw.Version != RequiresVersion {
		return fail("version %d: this host reads version %d only", *raw.Version, RequiresVersion)
	}
	r := &Requires{Version: RequiresVersion, ABIRevision: raw.ABIRevision, MinBudgetBytes: raw.MinBudgetBytes,
		Programs: raw.Programs, Streams: raw.Streams, Weights: raw.Weights, Inputs: raw.Inputs, Outputs: raw.Outputs}
	if raw.ABIRevision < 0 {
		return fail("abi_revision %d: want 1 or more", raw.ABIRevision)
	}
	if raw.MinBudgetBytes < 0 {
		return fail("min_budget_bytes %d: want 0 or more", raw.MinBudgetBytes)
	}
	switch w := string(bytes.TrimSpace(raw.WASI)); {
	case w == "" || w == "false" || w == "null":
	case w == "true":
		r.WASI = []string{"go-runtime"}
	default:
		if err := json.Unmarshal(raw.WASI, &r.WASI); err != nil {
			return fail("wasi: want true, false or a list of grants")
		}
	}
	items := 0
	for _, l := range []struct {
		key   string
		names []string
		valid func(string) bool
		want  string
	}{
		{"programs", r.Programs, validName, "1 to 128 printable ASCII characters, no space"},
		{"streams", r.Streams, validName, "1 to 128 printable ASCII characters, no space"},
		{"weights", r.Weights, weightsNameRE.MatchString, "1 to 64 of a-z 0-9 _ . -"},
		{"wasi", r.WASI, func(g string) bool { return g == "go-runtime" || slices.Contains(GoRuntimeWASI, g) }, `"go-runtime" or a WASI function it names (` + strings.Join(GoRuntimeWASI[:3], ", ") + ", …)"},
	} {
		items += len(l.names)
		if items > MaxRequiresItems {
			return fail("%s: more than %d items in all", l.key, MaxRequiresItems)
		}
		for i, n := range l.names {
			if !l.valid(n) {
				return fail("%s[%d]: %q: want %s", l.key, i, n, l.want)
			}
			if j := slices.Index(l.names, n); j < i {
				return fail("%s[%d]: %q is listed twice (also %s[%d])", l.key, i, n, l.key, j)
			}
		}
	}
	for _, l := range []struct {
		key     string
		tensors []TensorSpec
	}{{"inputs", r.Inputs}, {"outputs", r.Outputs}} {
		for i, t := range l.tensors {
			at := fmt.Sprintf("%s[%d]", l.key, i)
			items += 1 + len(t.Shape)
			if items > MaxRequiresItems {
				return fail("%s: more than %d items in all", at, MaxRequiresItems)
			}
			if !validName(t.Name) {
				return fail("%s.name: %q: want 1 to 128 printable ASCII characters, no space", at, t.Name)
			}
			for j := range i {
				if l.tensors[j].Name == t.Name {
					return fail("%s.name: %q is declared twice (also %s[%d])", at, t.Name, l.key, j)
				}
			}
			if DatatypeSize(t.Datatype) == 0 {
				return fail("%s.datatype: %q: want one of %s", at, t.Datatype, strings.Join(Datatypes, ", "))
			}
			if t.Shape == nil {
				return fail("%s.shape: required key is missing (a scalar is [])", at)
			}
			if len(t.Shape) > MaxTensorRank {
				return fail("%s.shape: rank %d, more than %d", at, len(t.Shape), MaxTensorRank)
			}
			for j, d := range t.Shape {
				if d < -1 || d > MaxDim {
					return fail("%s.shape[%d]: %d: want a size of 0 to 2^40, or -1 for a free dimension", at, j, d)
				}
			}
		}
	}
	return r, nil
}

// validName accepts 1 to 128 printable ASCII characters but space.
func validName(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

func jsonKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "*int"):
		return "an integer"
	case strings.HasPrefix(goType, "abi.TensorSpec"):
		return "an object"
	}
	return goType
}

// Marshal returns the document as the section holds it: compact JSON.
func (r *Requires) Marshal() []byte {
	type plain Requires // without methods
	b, _ := json.Marshal((*plain)(r))
	return b
}

// Offer is what a session, and the host, give a module: what [Requires.Check]
// checks a module's requirements against.
type Offer struct {
	// Session is the session's name; "" for a check without a session
	// (a module loaded, not yet running anywhere), which checks only the
	// host's revision and the module's WASI grants.
	Session  string
	Programs []string // the session's programs
	Streams  []string // the session's streams
	// Weights are the weights the session lists; nil when it lists none.
	Weights []string
	Budget  int64    // the session's device-memory budget, bytes
	WASI    []string // the grants the module is loaded with
	// Revision is the host's revision of v1; 0 means [Revision].
	Revision int
}

// Check returns nil when o meets every requirement of r, and otherwise
// one error that lists every item missing:
//
//	module "mlp" needs programs "matmul", "softmax" not listed by session "classify"; weights "digits": session "classify" lists no weights; ABI revision 3, the host has 2
//
// A nil r (a module without the section) requires nothing.
//
// # Errors
//
// [errdefs.ErrFailedPrecondition].
func (r *Requires) Check(module string, o Offer) error {
	if r == nil {
		return nil
	}
	var miss []string
	notListed := func(kind string, want, have []string) {
		var m []string
		for _, n := range want {
			if !slices.Contains(have, n) {
				m = append(m, fmt.Sprintf("%q", n))
			}
		}
		if len(m) > 0 {
			miss = append(miss, fmt.Sprintf("%s %s not listed by session %q", kind, strings.Join(m, ", "), o.Session))
		}
	}
	if o.Session != "" {
		notListed("programs", r.Programs, o.Programs)
		notListed("streams", r.Streams, o.Streams)
		switch {
		case len(r.Weights) == 0:
		case len(o.Weights) == 0:
			q := make([]string, len(r.Weights))
			for i, n := range r.Weights {
				q[i] = fmt.Sprintf("%q", n)
			}
			miss = append(miss, fmt.Sprintf("weights %s: session %q lists no weights", strings.Join(q, ", "), o.Session))
		default:
			notListed("weights", r.Weights, o.Weights)
		}
		if r.MinBudgetBytes > o.Budget {
			miss = append(miss, fmt.Sprintf("min_budget_bytes %d, more than session %q's budget of %d", r.MinBudgetBytes, o.Session, o.Budget))
		}
	}
	var grants []string
	for _, g := range r.WASI {
		if !granted(g, o.WASI) {
			grants = append(grants, fmt.Sprintf("%q", g))
		}
	}
	if len(grants) > 0 {
		miss = append(miss, fmt.Sprintf("WASI grants %s the module is not loaded with (manifest wasi, or admin --wasi)", strings.Join(grants, ", ")))
	}
	host := o.Revision
	if host == 0 {
		host = Revision
	}
	if r.ABIRevision > host {
		miss = append(miss, fmt.Sprintf("ABI revision %d, the host has %d", r.ABIRevision, host))
	}
	if len(miss) == 0 {
		return nil
	}
	return errdefs.Errorf(errdefs.ErrFailedPrecondition, "module %q needs %s", module, strings.Join(miss, "; "))
}

// granted reports whether grants cover grant g: g itself, or "go-runtime"
// for one of the functions it names, or every one of those for
// "go-runtime".
func granted(g string, grants []string) bool {
	if slices.Contains(grants, g) {
		return true
	}
	if g == "go-runtime" {
		for _, f := range GoRuntimeWASI {
			if !slices.Contains(grants, f) {
				return false
			}
		}
		return true
	}
	return slices.Contains(grants, "go-runtime") && slices.Contains(GoRuntimeWASI, g)
}

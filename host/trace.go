package host

import (
	"encoding/json"
	"io"
	"slices"
	"sync"
	"time"
)

// Record is one lane occupancy: a native stage or a coordinated
// submission, from admission to release.
type Record struct {
	Start  time.Time     // when the occupant was admitted
	Dur    time.Duration // how long it held the lane
	Wait   time.Duration // time spent waiting for admission before Start
	Lane   Lane
	Owner  string // session or submitter
	Device string // device label, one trace track group per device
	Failed bool
}

// Tracer keeps the most recent lane occupancies in a bounded ring and
// cumulative per-lane counters. It is safe for concurrent use. Recording
// allocates nothing, except once for each device's first record.
type Tracer struct {
	mu      sync.Mutex
	ring    []Record
	next    int // index of the next write
	total   uint64
	perLane [NumLanes]laneTotals
	epoch   time.Time

	perDevice map[string]*[NumLanes]laneTotals // the same totals by device
	lastDev   string                           // the device Record found last,
	lastTot   *[NumLanes]laneTotals            // and its totals: most records repeat it
}

type laneTotals struct {
	count  uint64
	failed uint64
	busy   time.Duration
}

func newTracer(capacity int, epoch time.Time) *Tracer {
	return &Tracer{ring: make([]Record, capacity), epoch: epoch}
}

// Record adds one occupancy.
func (t *Tracer) Record(r Record) {
	t.mu.Lock()
	t.ring[t.next] = r
	t.next++
	if t.next == len(t.ring) {
		t.next = 0
	}
	t.total++
	if int(r.Lane) < NumLanes {
		lt := &t.perLane[r.Lane]
		lt.count++
		lt.busy += r.Dur
		if r.Failed {
			lt.failed++
		}
		dt := t.lastTot
		if dt == nil || r.Device != t.lastDev {
			dt = t.perDevice[r.Device]
			if dt == nil { // once per device
				dt = new([NumLanes]laneTotals)
				if t.perDevice == nil {
					t.perDevice = map[string]*[NumLanes]laneTotals{}
				}
				t.perDevice[r.Device] = dt
			}
			t.lastDev, t.lastTot = r.Device, dt
		}
		dl := &dt[r.Lane]
		dl.count++
		dl.busy += r.Dur
		if r.Failed {
			dl.failed++
		}
	}
	t.mu.Unlock()
}

// Records returns the retained records, oldest first.
func (t *Tracer) Records() []Record {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := int(min(t.total, uint64(len(t.ring))))
	out := make([]Record, 0, n)
	if t.total > uint64(len(t.ring)) {
		out = append(out, t.ring[t.next:]...)
	}
	return append(out, t.ring[:t.next]...)
}

// Total is the number of records ever made, including overwritten ones.
func (t *Tracer) Total() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.total
}

// LaneSummary summarises one lane. Count, Failed and Busy cover every
// occupancy since the runtime started; the admission-wait percentiles
// cover the records still in the ring.
type LaneSummary struct {
	Lane     Lane
	Count    uint64
	Failed   uint64
	Busy     time.Duration
	WaitP50  time.Duration
	WaitP99  time.Duration
	Retained int // records in the ring that the percentiles use
}

// Summary returns one summary per lane, in lane order.
func (t *Tracer) Summary() []LaneSummary {
	return summarize(t.Records(), t.totals())
}

func (t *Tracer) totals() [NumLanes]laneTotals {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.perLane
}

// DeviceLaneSummary summarises one lane of one device: [LaneSummary]'s
// counts restricted to the occupancies of Device ("" for occupancies
// whose [Op] named no device).
type DeviceLaneSummary struct {
	Device string
	LaneSummary
}

// DeviceSummary returns one summary per lane of every device that has
// had an occupancy since the runtime started: devices sorted by name,
// lanes in lane order. Summed over devices they give [Tracer.Summary].
func (t *Tracer) DeviceSummary() []DeviceLaneSummary {
	records := t.Records()
	t.mu.Lock()
	totals := make(map[string][NumLanes]laneTotals, len(t.perDevice))
	for dev, tot := range t.perDevice {
		totals[dev] = *tot
	}
	t.mu.Unlock()
	byDev := map[string][]Record{}
	for _, r := range records {
		byDev[r.Device] = append(byDev[r.Device], r)
	}
	devs := make([]string, 0, len(totals))
	for dev := range totals {
		devs = append(devs, dev)
	}
	slices.Sort(devs)
	out := make([]DeviceLaneSummary, 0, len(devs)*NumLanes)
	for _, dev := range devs {
		for _, s := range summarize(byDev[dev], totals[dev]) {
			out = append(out, DeviceLaneSummary{Device: dev, LaneSummary: s})
		}
	}
	return out
}

// SummarizeRecords computes per-lane summaries from records, for example
// from a saved trace. Counts come from the records themselves.
func SummarizeRecords(records []Record) []LaneSummary {
	var totals [NumLanes]laneTotals
	for _, r := range records {
		if int(r.Lane) >= NumLanes {
			continue
		}
		lt := &totals[r.Lane]
		lt.count++
		lt.busy += r.Dur
		if r.Failed {
			lt.failed++
		}
	}
	return summarize(records, totals)
}

// summarize combines cumulative totals with percentiles from records.
func summarize(records []Record, totals [NumLanes]laneTotals) []LaneSummary {
	waits := make([][]time.Duration, NumLanes)
	for _, r := range records {
		if int(r.Lane) < NumLanes {
			waits[r.Lane] = append(waits[r.Lane], r.Wait)
		}
	}
	out := make([]LaneSummary, NumLanes)
	for i := range out {
		w := waits[i]
		slices.Sort(w)
		out[i] = LaneSummary{
			Lane: Lane(i), Count: totals[i].count, Failed: totals[i].failed, Busy: totals[i].busy,
			WaitP50: percentile(w, 50), WaitP99: percentile(w, 99), Retained: len(w),
		}
	}
	return out
}

// percentile uses the nearest-rank method on sorted data.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := (p*len(sorted) + 99) / 100 // ceil(p/100 * n)
	return sorted[max(rank, 1)-1]
}

// chromeEvent is one entry of the Chrome trace-event format.
type chromeEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`            // microseconds
	Dur  float64        `json:"dur,omitempty"` // microseconds
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

type chromeTrace struct {
	TraceEvents     []chromeEvent `json:"traceEvents"`
	DisplayTimeUnit string        `json:"displayTimeUnit"`
}

// WriteChromeTrace writes the retained records as Chrome trace-event JSON,
// which Perfetto and chrome://tracing open. Each device is a process (one
// named "runtime" for records that name no device) and each lane a
// thread, so every (device, lane) pair gets its own track.
// Timestamps are microseconds since the runtime started.
//
// # Errors
//
// Only those of w.
func (t *Tracer) WriteChromeTrace(w io.Writer) error {
	return WriteChromeTrace(w, t.Records(), t.epoch)
}

// WriteChromeTrace writes records as Chrome trace-event JSON relative to
// epoch. See [Tracer.WriteChromeTrace].
func WriteChromeTrace(w io.Writer, records []Record, epoch time.Time) error {
	pids := map[string]int{}
	var events []chromeEvent
	for _, r := range records {
		dev := r.Device
		if dev == "" {
			dev = "runtime"
		}
		pid, ok := pids[dev]
		if !ok {
			pid = len(pids) + 1
			pids[dev] = pid
			events = append(events, chromeEvent{Name: "process_name", Ph: "M", Pid: pid, Args: map[string]any{"name": dev}})
			for l := range NumLanes {
				events = append(events, chromeEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: l, Args: map[string]any{"name": Lane(l).String()}})
			}
		}
		events = append(events, chromeEvent{
			Name: r.Owner, Cat: r.Lane.String(), Ph: "X",
			Ts:  float64(r.Start.Sub(epoch).Nanoseconds()) / 1e3,
			Dur: float64(r.Dur.Nanoseconds()) / 1e3,
			Pid: pid, Tid: int(r.Lane),
			Args: map[string]any{"failed": r.Failed, "admission_wait_us": float64(r.Wait.Nanoseconds()) / 1e3, "device": dev},
		})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(chromeTrace{TraceEvents: events, DisplayTimeUnit: "ns"})
}

// ReadChromeTrace parses a trace written by [WriteChromeTrace] back into
// records, for offline summaries. Start times are relative to the zero
// time, and a record written without a device comes back with Device
// "runtime".
//
// # Errors
//
// A JSON syntax error, or an event whose lane name is unknown.
func ReadChromeTrace(r io.Reader) ([]Record, error) {
	var tr chromeTrace
	if err := json.NewDecoder(r).Decode(&tr); err != nil {
		return nil, err
	}
	devices := map[int]string{}
	for _, e := range tr.TraceEvents {
		if e.Ph == "M" && e.Name == "process_name" {
			if n, ok := e.Args["name"].(string); ok {
				devices[e.Pid] = n
			}
		}
	}
	var epoch time.Time
	var out []Record
	for _, e := range tr.TraceEvents {
		if e.Ph != "X" {
			continue
		}
		lane, err := parseLane(e.Cat)
		if err != nil {
			return nil, err
		}
		failed, _ := e.Args["failed"].(bool)
		wait, _ := e.Args["admission_wait_us"].(float64)
		out = append(out, Record{
			Start:  epoch.Add(time.Duration(e.Ts * 1e3)),
			Dur:    time.Duration(e.Dur * 1e3),
			Wait:   time.Duration(wait * 1e3),
			Lane:   lane,
			Owner:  e.Name,
			Device: devices[e.Pid],
			Failed: failed,
		})
	}
	return out, nil
}

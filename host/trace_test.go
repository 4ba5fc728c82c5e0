package host

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"
)

func TestTracerRecordsEveryOccupancyAndSummarizes(t *testing.T) {
	rt := newTestRuntime(t, 4)
	ctx := context.Background()
	boom := errors.New("boom")
	for i := range 10 {
		err := rt.Submit(ctx, Op{Lane: LaneUpload, Owner: "up", Device: "gpu0"}, func(context.Context) error {
			if i == 3 {
				return boom
			}
			return nil
		})
		if (i == 3) != errors.Is(err, boom) {
			t.Fatalf("submit %d: %v", i, err)
		}
	}
	var l Lease
	if err := rt.AcquireCompute(ctx, Op{Owner: "stage", Device: "gpu0"}, &l); err != nil {
		t.Fatal(err)
	}
	l.Release(true)

	recs := rt.Tracer().Records()
	if len(recs) != 11 {
		t.Fatalf("%d records", len(recs))
	}
	last := recs[10]
	if last.Lane != LaneCompute || last.Owner != "stage" || !last.Failed || last.Device != "gpu0" || last.Start.IsZero() {
		t.Fatalf("stage record %+v", last)
	}
	sum := rt.Tracer().Summary()
	if sum[LaneUpload].Count != 10 || sum[LaneUpload].Failed != 1 || sum[LaneCompute].Count != 1 || sum[LaneCompute].Failed != 1 {
		t.Fatalf("summary %+v", sum)
	}
	if sum[LaneDownload].Count != 0 {
		t.Fatalf("download %+v", sum[LaneDownload])
	}
}

func TestTracerRingKeepsNewestAndCountsAll(t *testing.T) {
	rt, err := NewRuntime(NewConfig().WithTraceCapacity(3))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		rt.Tracer().Record(Record{Lane: LaneNPU, Owner: string(rune('a' + i)), Wait: time.Duration(i)})
	}
	recs := rt.Tracer().Records()
	if len(recs) != 3 || recs[0].Owner != "c" || recs[2].Owner != "e" {
		t.Fatalf("%+v", recs)
	}
	s := rt.Tracer().Summary()[LaneNPU]
	if s.Count != 5 || s.Retained != 3 || s.WaitP50 != 3 || s.WaitP99 != 4 {
		t.Fatalf("%+v", s)
	}
}

func TestPercentileNearestRank(t *testing.T) {
	d := make([]time.Duration, 100)
	for i := range d {
		d[i] = time.Duration(i + 1)
	}
	if percentile(d, 50) != 50 || percentile(d, 99) != 99 || percentile(d[:1], 99) != 1 || percentile(nil, 50) != 0 {
		t.Fatal("percentile")
	}
}

func TestChromeTraceRoundTripsAndHasOneTrackPerLaneAndDevice(t *testing.T) {
	epoch := time.Unix(1000, 0)
	recs := []Record{
		{Start: epoch.Add(time.Millisecond), Dur: 2 * time.Millisecond, Wait: 3 * time.Microsecond, Lane: LaneCompute, Owner: "mlp", Device: "gpu0"},
		{Start: epoch.Add(2 * time.Millisecond), Dur: time.Millisecond, Lane: LaneUpload, Owner: "mlp", Device: "gpu0", Failed: true},
		{Start: epoch.Add(2 * time.Millisecond), Dur: time.Millisecond, Lane: LaneNPU, Owner: "resident", Device: "npu0"},
	}
	var buf bytes.Buffer
	if err := WriteChromeTrace(&buf, recs, epoch); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		TraceEvents []map[string]any `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	tracks := map[[2]float64]bool{}
	names := map[float64]string{}
	for _, e := range raw.TraceEvents {
		switch e["ph"] {
		case "X":
			tracks[[2]float64{e["pid"].(float64), e["tid"].(float64)}] = true
		case "M":
			if e["name"] == "process_name" {
				names[e["pid"].(float64)] = e["args"].(map[string]any)["name"].(string)
			}
		}
	}
	if len(tracks) != 3 || len(names) != 2 {
		t.Fatalf("tracks %v, processes %v", tracks, names)
	}
	back, err := ReadChromeTrace(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(back) != 3 {
		t.Fatalf("%d records back", len(back))
	}
	for i := range recs {
		if back[i].Lane != recs[i].Lane || back[i].Owner != recs[i].Owner || back[i].Device != recs[i].Device ||
			back[i].Failed != recs[i].Failed || back[i].Dur != recs[i].Dur || back[i].Wait != recs[i].Wait {
			t.Fatalf("record %d: %+v != %+v", i, back[i], recs[i])
		}
	}
	sum := SummarizeRecords(back)
	if sum[LaneUpload].Failed != 1 || sum[LaneCompute].Busy != 2*time.Millisecond {
		t.Fatalf("%+v", sum)
	}
}

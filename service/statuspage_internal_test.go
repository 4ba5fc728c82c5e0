package service

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stagehost/stagehost/deploy"
)

// TestStatusPageEscapes: names, reasons and guest-provided error text
// are HTML-escaped wherever the page shows them.
func TestStatusPageEscapes(t *testing.T) {
	const evil = `<script>alert("x")</script><img src=x onerror=alert(1)>`
	v := statusView{Generated: "now", Refresh: 5, Readiness: deploy.Readiness{Status: "not_ready", Reasons: []string{"session x is failed: " + evil}},
		Devices:   []deviceView{{Name: "gpu0" + evil, Backend: "sim", Engine: "gpu", Health: "lost", Error: evil}},
		Window:    "1m0s",
		Lanes:     LaneOccupancy(nil, time.Time{}, OccupancyWindow, []string{"dev" + evil}),
		Sessions:  []sessionView{sessionFromStatus(deploy.SessionStatus{Name: "s" + evil, Stage: evil, Device: evil, State: "failed", Reason: "trap: " + evil + "\nwasm stack trace:\n" + evil, Outcomes: map[string]uint64{evil: 1}})},
		Residents: []residentView{{Name: "r" + evil, GPU: evil, NPU: evil, Runs: []runView{{ID: 1, State: "failed", Error: evil}}}},
		Script:    "",
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, v); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if strings.Contains(page, "<script>alert") || strings.Contains(page, "<img") {
		t.Fatalf("unescaped markup:\n%s", page)
	}
	if n := strings.Count(page, "&lt;script&gt;alert("); n < 10 {
		t.Errorf("%d escaped copies of the markup, want every field:\n%s", n, page)
	}
	if strings.Count(page, "<script>") != 1 {
		t.Errorf("the page has other scripts than its own")
	}
	// The summary of a reason is its first line, without the stack trace.
	if !strings.Contains(page, `<summary>trap: &lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;</summary>`) {
		t.Errorf("reason summary:\n%s", page)
	}

	var sign bytes.Buffer
	if err := statusTemplate.ExecuteTemplate(&sign, "signin", signInView{Message: evil}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sign.String(), "<script>alert") {
		t.Errorf("sign-in message unescaped")
	}
}

// TestStatusPageShowsInstances: a status with instances (a session pool)
// gets one row per instance, and fields the page does not know are shown
// as details.
func TestStatusPageShowsInstances(t *testing.T) {
	sv := sessionFromJSON([]byte(`{"name":"pooled","stage":"good","device":"gpu0","state":"ready","calls":7,"failures":1,
		"outcomes":{"ok":6,"fault":1},"instances_out":1,"waiting":0,"new_field":"x","empty":"","none":[],
		"stage_sha256":"b50d6b351eaf4c3171cd6a51a02646a693d91ca05f2892ca17e73d22e6aae757",
		"instances":[{"index":0,"device":"gpu0","state":"ready","budget_used_bytes":64},
		             {"index":1,"device":"gpu1","state":"quarantined","reason":"fence <b>lied</b>"}]}`))
	if sv.Name != "pooled" || sv.Calls != "7" || len(sv.Outcomes) != 2 || len(sv.Instances) != 2 {
		t.Fatalf("%+v", sv)
	}
	if got := sv.Instances[1]; got.Label != "instance 1" || got.State != "quarantined" || got.Device != "gpu1" || got.Reason != "fence <b>lied</b>" {
		t.Errorf("instance 1: %+v", got)
	}
	if len(sv.Instances[0].Details) != 1 || sv.Instances[0].Details[0] != (kv{K: "budget_used_bytes", V: "64"}) {
		t.Errorf("instance 0 details: %+v", sv.Instances[0].Details)
	}
	want := []kv{{K: "instances_out", V: "1"}, {K: "new_field", V: "x"},
		{"stage_sha256", "b50d6b351eaf…", "b50d6b351eaf4c3171cd6a51a02646a693d91ca05f2892ca17e73d22e6aae757"}, {K: "waiting", V: "0"}}
	if len(sv.Details) != len(want) {
		t.Fatalf("details %+v", sv.Details)
	}
	for i := range want {
		if sv.Details[i] != want[i] {
			t.Errorf("details %+v, want %+v", sv.Details, want)
		}
	}
	var buf bytes.Buffer
	if err := statusTemplate.Execute(&buf, statusView{Sessions: []sessionView{sv}}); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if strings.Count(page, `<tr class="instance"`) != 2 || !strings.Contains(page, `<tr class="instance" data-state="quarantined"><td class="inst">instance 1</td><td><span class="state bad">quarantined</span>`) ||
		strings.Contains(page, "<b>lied") {
		t.Errorf("instance rows:\n%s", page)
	}
}

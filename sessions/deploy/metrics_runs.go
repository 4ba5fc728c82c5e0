package deploy

import "github.com/prometheus/client_golang/prometheus"

// residentRunStates are the states a resident run is in (ResidentRun.State).
var residentRunStates = []string{"starting", "running", "verified", "failed", "quarantined"}

var (
	residentRunsStarted = prometheus.NewDesc("stagehost_resident_runs_started_total",
		"Runs of the resident started since the service started (a start refused at admission is not a run).", []string{"resident"}, nil)
	residentRunsByState = prometheus.NewDesc("stagehost_resident_runs",
		"Runs of the resident in its retained history (the last `history` runs; GET /v1/residents/{name}) by state: starting, running, verified, failed, quarantined.",
		[]string{"resident", "state"}, nil)
)

// residentRunsCollector exports every resident's runs at scrape time:
// how many were started, and its retained runs by state.
type residentRunsCollector struct{ d *Deployment }

func (c residentRunsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- residentRunsStarted
	ch <- residentRunsByState
}

func (c residentRunsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, name := range c.d.ResidentNames() {
		runs := c.d.Resident(name).Runs()
		started := 0 // run ids count from 1 in start order, so the newest run's id
		byState := make(map[string]int, len(residentRunStates))
		for _, r := range runs {
			started = max(started, r.ID)
			byState[r.State]++
		}
		ch <- prometheus.MustNewConstMetric(residentRunsStarted, prometheus.CounterValue, float64(started), name)
		for _, st := range residentRunStates {
			ch <- prometheus.MustNewConstMetric(residentRunsByState, prometheus.GaugeValue, float64(byState[st]), name, st)
		}
	}
}

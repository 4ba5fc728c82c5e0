// Package metrics exposes a [host.Runtime]'s lanes, capacity and
// quarantines as Prometheus metrics. The collector reads the runtime at
// scrape time, so recording a lane occupancy costs nothing extra.
//
// Every lane metric has the labels device and lane: each device has its
// own four lanes (two GPUs' compute lanes are two series). Occupancies
// whose [host.Op] named no device have device="" (the label is then
// absent in Prometheus's data model). Sum by lane for the runtime's
// totals.
//
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(metrics.NewCollector(rt))
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
package metrics

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stagehost/stagehost/host"
)

// Collector is a prometheus.Collector over one runtime.
type Collector struct {
	rt      *host.Runtime
	devices []string // reported even before their first occupancy

	occupancies, failures, busy *prometheus.Desc
	waitP50, waitP99            *prometheus.Desc
	capUsed, capTotal           *prometheus.Desc
	leased, active              *prometheus.Desc
	quarantined, quarBytes      *prometheus.Desc
}

// NewCollector returns a collector for rt. The lanes of devices are
// reported from the start, with zeros until their first occupancy; those
// of any other device once it has had one.
func NewCollector(rt *host.Runtime, devices ...string) *Collector {
	lane := []string{"device", "lane"}
	return &Collector{
		rt:          rt,
		devices:     slices.Clone(devices),
		occupancies: prometheus.NewDesc("stagehost_lane_occupancies_total", "Lane occupancies (stages and coordinated submissions) since start.", lane, nil),
		failures:    prometheus.NewDesc("stagehost_lane_failures_total", "Lane occupancies that failed.", lane, nil),
		busy:        prometheus.NewDesc("stagehost_lane_busy_seconds_total", "Time lanes were occupied.", lane, nil),
		waitP50:     prometheus.NewDesc("stagehost_lane_admission_wait_p50_seconds", "Median admission wait over the traced window.", lane, nil),
		waitP99:     prometheus.NewDesc("stagehost_lane_admission_wait_p99_seconds", "99th percentile admission wait over the traced window.", lane, nil),
		capUsed:     prometheus.NewDesc("stagehost_capacity_used_units", "Submission capacity units held now.", nil, nil),
		capTotal:    prometheus.NewDesc("stagehost_capacity_units", "Bounded submission capacity.", nil, nil),
		leased:      prometheus.NewDesc("stagehost_lane_leased", "1 while a native stage holds the lane exclusively.", lane, nil),
		active:      prometheus.NewDesc("stagehost_lane_active_submissions", "Coordinated submissions occupying the lane now.", lane, nil),
		quarantined: prometheus.NewDesc("stagehost_quarantined_owners", "Owners quarantined because their fence could not be proven.", nil, nil),
		quarBytes:   prometheus.NewDesc("stagehost_quarantined_bytes", "Memory kept charged by quarantined owners.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.occupancies, c.failures, c.busy, c.waitP50, c.waitP99,
		c.capUsed, c.capTotal, c.leased, c.active, c.quarantined, c.quarBytes} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.rt.Stats()
	holders := c.rt.DeviceLanes()
	seen := map[string]bool{}
	emit := func(dev string, s host.LaneSummary) {
		l := s.Lane.String()
		ch <- prometheus.MustNewConstMetric(c.occupancies, prometheus.CounterValue, float64(s.Count), dev, l)
		ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(s.Failed), dev, l)
		ch <- prometheus.MustNewConstMetric(c.busy, prometheus.CounterValue, s.Busy.Seconds(), dev, l)
		ch <- prometheus.MustNewConstMetric(c.waitP50, prometheus.GaugeValue, s.WaitP50.Seconds(), dev, l)
		ch <- prometheus.MustNewConstMetric(c.waitP99, prometheus.GaugeValue, s.WaitP99.Seconds(), dev, l)
		leased := 0.0
		if holders[dev].Leased[s.Lane] {
			leased = 1
		}
		ch <- prometheus.MustNewConstMetric(c.leased, prometheus.GaugeValue, leased, dev, l)
		ch <- prometheus.MustNewConstMetric(c.active, prometheus.GaugeValue, float64(holders[dev].Active[s.Lane]), dev, l)
	}
	for _, s := range c.rt.Tracer().DeviceSummary() {
		seen[s.Device] = true
		emit(s.Device, s.LaneSummary)
	}
	// Devices without an occupancy yet: declared, or holding a lane now
	// (an occupancy is recorded when it ends).
	var rest []string
	for _, dev := range c.devices {
		if !seen[dev] {
			rest = append(rest, dev)
			seen[dev] = true
		}
	}
	for dev := range holders {
		if !seen[dev] {
			rest = append(rest, dev)
			seen[dev] = true
		}
	}
	for _, dev := range rest {
		for l := range host.NumLanes {
			emit(dev, host.LaneSummary{Lane: host.Lane(l)})
		}
	}
	ch <- prometheus.MustNewConstMetric(c.capUsed, prometheus.GaugeValue, float64(st.CapacityUsed))
	ch <- prometheus.MustNewConstMetric(c.capTotal, prometheus.GaugeValue, float64(st.Capacity))
	ch <- prometheus.MustNewConstMetric(c.quarantined, prometheus.GaugeValue, float64(len(st.Quarantined)))
	ch <- prometheus.MustNewConstMetric(c.quarBytes, prometheus.GaugeValue, float64(st.QuarantinedBytes))
}

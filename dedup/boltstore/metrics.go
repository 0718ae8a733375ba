package boltstore

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the store's metrics, read from Stats at each scrape,
// for the caller to register (the gateway's own are in proxy/metrics.go):
//
//   - dedupgw_bolt_journal_backlog_bytes (gauge): Stats.BacklogBytes;
//   - dedupgw_bolt_journal_backlog_limit_bytes (gauge): Stats.MaxBacklogBytes;
//   - dedupgw_bolt_checkpoint_failures_total (counter):
//     Stats.CheckpointFailures;
//   - dedupgw_bolt_swept_records_total (counter): Stats.SweptRecords;
//   - dedupgw_bolt_file_bytes (gauge): Stats.FileBytes.
//
// A checkpointer that cannot write the bbolt file otherwise only logs a
// warning per retry, while the journal grows until commits wait for it.
func (s *Store) Collectors() []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dedupgw_bolt_journal_backlog_bytes",
			Help: "Bytes of journal files waiting to be checkpointed into the bbolt file.",
		}, func() float64 { return float64(s.Stats().BacklogBytes) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dedupgw_bolt_journal_backlog_limit_bytes",
			Help: "The journal backlog past which commits wait for checkpoints.",
		}, func() float64 { return float64(s.Stats().MaxBacklogBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "dedupgw_bolt_checkpoint_failures_total",
			Help: "Checkpoints of the journal into the bbolt file that failed (each is retried).",
		}, func() float64 { return float64(s.Stats().CheckpointFailures) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "dedupgw_bolt_swept_records_total",
			Help: "Expired records the sweeper deleted from the bbolt file.",
		}, func() float64 { return float64(s.Stats().SweptRecords) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dedupgw_bolt_file_bytes",
			Help: "Size of the bbolt file; it does not shrink when records expire (bbolt reuses the pages).",
		}, func() float64 { return float64(s.Stats().FileBytes) }),
	}
}

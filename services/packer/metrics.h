// Every metric of tutti-packerd, declared once (children created here).
// Names follow DESIGN.md: prefix tutti_, base units, counters _total,
// histograms _seconds / _bytes.
#ifndef TUTTI_SERVICES_PACKER_METRICS_H_
#define TUTTI_SERVICES_PACKER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tutti::packer {

struct PackerMetrics {
  explicit PackerMetrics(prometheus::Registry& registry);

  // Families (declared first: the children below are created from them).
  prometheus::Family<prometheus::Gauge>& imbalance_family;
  prometheus::Family<prometheus::Gauge>& imbalance_before_family;
  prometheus::Family<prometheus::Counter>& served_family;
  prometheus::Family<prometheus::Counter>& errors_family;
  prometheus::Family<prometheus::Counter>& timing_family;
  prometheus::Family<prometheus::Gauge>& fitted_family;

  // tutti_packer_plan_seconds: planning-core time per step.
  prometheus::Histogram& plan_seconds;
  // tutti_packer_plan_build_seconds: turning a plan into a StepPlan message.
  prometheus::Histogram& plan_build_seconds;
  // tutti_packer_imbalance_ratio{phase}: max/mean cost across ranks of the
  // latest planned step ("vit", "llm", "audio"); ..._before_ratio for the
  // drawn (unbalanced) split of the same step.
  prometheus::Gauge& imbalance_vit;
  prometheus::Gauge& imbalance_llm;
  prometheus::Gauge& imbalance_audio;
  prometheus::Gauge& imbalance_before_vit;
  prometheus::Gauge& imbalance_before_llm;
  prometheus::Gauge& imbalance_before_audio;
  // tutti_packer_samples_planned_total / tutti_packer_steps_planned_total
  prometheus::Counter& samples_planned;
  prometheus::Counter& steps_planned;
  // tutti_packer_plan_failures_total: steps that could not be planned.
  prometheus::Counter& plan_failures;
  // tutti_packer_overflow_total{kind}: what the overflow policy did in the
  // steps planned: samples deferred (to a later step), long documents split,
  // truncated and skipped, and steps packed by the first-fit fallback.
  prometheus::Family<prometheus::Counter>& overflow_family;
  prometheus::Counter& overflow_deferred;
  prometheus::Counter& overflow_split;
  prometheus::Counter& overflow_truncated;
  prometheus::Counter& overflow_skipped;
  prometheus::Counter& overflow_fallback_steps;
  // tutti_packer_deferred_samples: samples waiting after the last step planned.
  prometheus::Gauge& deferred_samples;
  // tutti_packer_plan_window_depth: planned steps ready ahead of the
  // furthest step a client asked for.
  prometheus::Gauge& window_depth;
  // tutti_packer_client_step: the furthest step a client asked for.
  prometheus::Gauge& client_step;
  // tutti_packer_plans_served_total{rpc}
  prometheus::Counter& served_get;
  prometheus::Counter& served_stream;
  // tutti_packer_rpc_errors_total{code}: requests refused.
  prometheus::Counter& errors_invalid_argument;
  prometheus::Counter& errors_out_of_range;
  prometheus::Counter& errors_failed_precondition;
  prometheus::Counter& errors_other;
  // tutti_packer_timing_reports_total{result}
  prometheus::Counter& timing_accepted;
  prometheus::Counter& timing_rejected;
  // tutti_packer_reported_phase_seconds{phase}: phase times clients report.
  prometheus::Family<prometheus::Histogram>& reported_phase_seconds;
  prometheus::Histogram& reported_data_wait;
  prometheus::Histogram& reported_vit;
  prometheus::Histogram& reported_llm;
  prometheus::Histogram& reported_exchange;
  prometheus::Histogram& reported_step;
  prometheus::Histogram& reported_other;
  // tutti_packer_cost_seconds_per_unit{phase}: fitted seconds per unit of
  // planned cost (moving average over reports; informational, plans do not
  // change).
  prometheus::Gauge& fitted_vit;
  prometheus::Gauge& fitted_llm;
  // tutti_packer_exchange_inter_node_bytes / _intra_node_bytes: bytes of a
  // step's forward exchange (encoder outputs) between nodes and between
  // ranks of one node (a rank's bytes to itself are neither);
  // tutti_packer_exchange_remote_load_bytes: its load exchange (inputs whose
  // shard the encoder's or LLM rank's node does not stage).
  prometheus::Histogram& inter_node_bytes;
  prometheus::Histogram& intra_node_bytes;
  prometheus::Histogram& remote_load_bytes;
  // tutti_packer_rearrangements_total{result}: how post-balancing chose each
  // step's LLM placement: "fast", "ilp_optimal", "ilp_fast_kept" (GLPK did
  // not prove an optimum within its budget).
  prometheus::Family<prometheus::Counter>& rearrangement_family;
  prometheus::Counter& rearrangement_fast;
  prometheus::Counter& rearrangement_ilp_optimal;
  prometheus::Counter& rearrangement_ilp_fast_kept;
  // tutti_packer_index_samples: samples in the loaded index.
  prometheus::Gauge& index_samples;
  // tutti_packer_index_bytes{memory}: the loaded index's file, mapped
  // ("mapped": page-cache pages, shared and evictable), and what loading it
  // allocated ("heap"); tutti_packer_job_heap_bytes: what building the job
  // over it allocated (per-image grids per curriculum stage, filtered
  // streams); tutti_packer_memory_per_sample_bytes{memory}: mapped, and
  // heap (index + job), divided by the samples. SetMemory sets them all.
  prometheus::Family<prometheus::Gauge>& index_bytes_family;
  prometheus::Family<prometheus::Gauge>& per_sample_family;
  prometheus::Gauge& job_heap_bytes;
  void SetMemory(uint64_t samples, uint64_t index_mapped, uint64_t index_heap, uint64_t job_heap);
  // tutti_packer_unplanned_samples{reason}: samples of the index the stager
  // would refuse, left out of every plan at load (Job::unservable):
  // image_too_large, too_many_images, no_token_ids.
  prometheus::Family<prometheus::Gauge>& unplanned_family;
  void SetUnplanned(const std::map<std::string, uint64_t>& by_reason);
  // tutti_packer_served_plan_cache_total{result="hit"|"joined"|"miss"}:
  // plans served from the kept serialized plans, after waiting for a build
  // of the same bytes under way, or built (served_plans.h);
  // tutti_packer_served_plan_cache_bytes: the bytes kept;
  // tutti_packer_served_plans_precomputed_total: plans built and kept when
  // their step was planned, before any client asked.
  prometheus::Family<prometheus::Counter>& served_cache_family;
  prometheus::Counter& served_cache_hits;
  prometheus::Counter& served_cache_joined;
  prometheus::Counter& served_cache_misses;
  prometheus::Gauge& served_cache_bytes;
  prometheus::Counter& served_precomputed;
  // With locality (job config locality; steps of other jobs do not count):
  // tutti_packer_locality_items_total{load="local"|"remote"}: the inputs
  // planned (images, audio clips, documents' token ids) whose shard the
  // loading rank's node stages, and the rest, which a holder's stager sends;
  // tutti_packer_locality_remote_member_bytes: per step, the member bytes
  // (as stored in the shards) of the remote ones;
  // tutti_packer_locality_vit_over_lower_bound: the last step's slowest ViT
  // rank over the phase's lower bound (1 = perfect balance), the balance
  // paid for locality.
  prometheus::Family<prometheus::Counter>& locality_items_family;
  prometheus::Counter& locality_local_items;
  prometheus::Counter& locality_remote_items;
  prometheus::Histogram& locality_remote_member_bytes;
  prometheus::Gauge& locality_vit_over_lower_bound;
  // The node changes the stagers' reports lead to (locality_monitor.h):
  // tutti_packer_locality_nodes{state="live"|"removed"|"silent"|"unreported"}:
  // nodes live in the latest homes, removed from them, live but not heard
  // from within --node_dead_after_s (about to be removed), live and never
  // heard from; tutti_packer_locality_rehomings_total{reason="dead"|
  // "returned"|"capacity"}: changes announced;
  // tutti_packer_locality_rehomings_refused_total{reason}: changes that
  // could not be taken (the homes would not fit the capacities, or the
  // record could not be written; the log says which);
  // tutti_packer_locality_change_from_step: the step the latest change is
  // in force from; tutti_packer_locality_node_cache_bytes{node,
  // kind="capacity"|"held"|"assigned"}: per node, its last report and the
  // bytes the latest homes assign it; tutti_packer_locality_reports_total{
  // result="accepted"|"rejected"}.
  prometheus::Family<prometheus::Gauge>& locality_nodes_family;
  prometheus::Family<prometheus::Counter>& locality_rehomings_family;
  prometheus::Family<prometheus::Counter>& locality_rehomings_refused_family;
  prometheus::Gauge& locality_change_from_step;
  prometheus::Family<prometheus::Gauge>& locality_node_cache_bytes;
  prometheus::Family<prometheus::Counter>& locality_reports_family;
  prometheus::Counter& locality_reports_accepted;
  prometheus::Counter& locality_reports_rejected;
  // The online cost fit (job.proto CostFitConfig):
  // tutti_packer_cost_fits_total{result}: fit rounds that announced new
  // constants ("announced"), found them close to those in force
  // ("unchanged") or could fit no phase ("refused", the log says why);
  // tutti_packer_cost_fit_from_step: the step the latest fit takes effect
  // at (0: none); tutti_packer_cost_fit_constant{phase,term}: its constants.
  prometheus::Family<prometheus::Counter>& cost_fits_family;
  prometheus::Counter& cost_fits_announced;
  prometheus::Counter& cost_fits_unchanged;
  prometheus::Counter& cost_fits_refused;
  prometheus::Gauge& cost_fit_from_step;
  prometheus::Family<prometheus::Gauge>& cost_fit_constant;

  // tutti_packer_source_samples_total{source}: samples of each source in
  // the steps planned (a document split in pieces counts once);
  // tutti_packer_source_epochs{source}: the source's epochs drawn by the
  // furthest step planned (samples drawn / its source-epoch; 2.5 = halfway
  // through its third). One child per source the job names (at most 256,
  // job.proto), created by SetSources.
  prometheus::Family<prometheus::Counter>& source_samples_family;
  prometheus::Family<prometheus::Gauge>& source_epochs_family;
  void SetSources(const std::vector<std::string>& names);
  // A planned step's samples by source and every source's epochs drawn
  // through it (the gauges follow the furthest step). Thread-safe.
  void SourcesPlanned(uint64_t step, const std::vector<uint32_t>& samples,
                      const std::vector<double>& epochs);

  prometheus::Histogram& ReportedPhase(const std::string& phase);
  void CountError(int grpc_code);

 private:
  std::vector<prometheus::Counter*> source_samples_;
  std::vector<prometheus::Gauge*> source_epochs_;
  absl::Mutex sources_mu_;
  uint64_t furthest_step_ ABSL_GUARDED_BY(sources_mu_) = 0;
  bool any_step_ ABSL_GUARDED_BY(sources_mu_) = false;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_METRICS_H_

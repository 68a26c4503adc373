#include "services/packer/metrics.h"

#include <algorithm>

#include "absl/status/status.h"
#include "common/metrics_server.h"

namespace tutti::packer {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

const prometheus::Histogram::BucketBoundaries& ByteBuckets() {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {1e3, 1e4, 1e5,  1e6, 1e7,
                                                                   1e8, 1e9, 1e10, 1e11};
  return kBuckets;
}

}  // namespace

PackerMetrics::PackerMetrics(prometheus::Registry& r)
    : imbalance_family(BuildGauge()
                           .Name("tutti_packer_imbalance_ratio")
                           .Help("Max/mean cost across ranks of the latest planned step")
                           .Register(r)),
      imbalance_before_family(
          BuildGauge()
              .Name("tutti_packer_imbalance_before_ratio")
              .Help("Max/mean cost across ranks of the drawn (unbalanced) split, latest step")
              .Register(r)),
      served_family(BuildCounter()
                        .Name("tutti_packer_plans_served_total")
                        .Help("Plans sent to clients")
                        .Register(r)),
      errors_family(BuildCounter()
                        .Name("tutti_packer_rpc_errors_total")
                        .Help("Requests refused, by gRPC code")
                        .Register(r)),
      timing_family(BuildCounter()
                        .Name("tutti_packer_timing_reports_total")
                        .Help("Step timing reports received")
                        .Register(r)),
      fitted_family(BuildGauge()
                        .Name("tutti_packer_cost_seconds_per_unit")
                        .Help("Fitted seconds per unit of planned cost, from timing reports")
                        .Register(r)),
      plan_seconds(BuildHistogram()
                       .Name("tutti_packer_plan_seconds")
                       .Help("Planning-core time per step")
                       .Register(r)
                       .Add({}, LatencyBuckets())),
      plan_build_seconds(BuildHistogram()
                             .Name("tutti_packer_plan_build_seconds")
                             .Help("Time to build a StepPlan message from a computed plan")
                             .Register(r)
                             .Add({}, LatencyBuckets())),
      imbalance_vit(imbalance_family.Add({{"phase", "vit"}})),
      imbalance_llm(imbalance_family.Add({{"phase", "llm"}})),
      imbalance_audio(imbalance_family.Add({{"phase", "audio"}})),
      imbalance_before_vit(imbalance_before_family.Add({{"phase", "vit"}})),
      imbalance_before_llm(imbalance_before_family.Add({{"phase", "llm"}})),
      imbalance_before_audio(imbalance_before_family.Add({{"phase", "audio"}})),
      samples_planned(BuildCounter()
                          .Name("tutti_packer_samples_planned_total")
                          .Help("Samples placed in computed plans")
                          .Register(r)
                          .Add({})),
      steps_planned(BuildCounter()
                        .Name("tutti_packer_steps_planned_total")
                        .Help("Steps planned")
                        .Register(r)
                        .Add({})),
      plan_failures(BuildCounter()
                        .Name("tutti_packer_plan_failures_total")
                        .Help("Steps that could not be planned")
                        .Register(r)
                        .Add({})),
      overflow_family(BuildCounter()
                          .Name("tutti_packer_overflow_total")
                          .Help("What the overflow policy did in planned steps, by kind")
                          .Register(r)),
      overflow_deferred(overflow_family.Add({{"kind", "deferred"}})),
      overflow_split(overflow_family.Add({{"kind", "split"}})),
      overflow_truncated(overflow_family.Add({{"kind", "truncated"}})),
      overflow_skipped(overflow_family.Add({{"kind", "skipped"}})),
      overflow_fallback_steps(overflow_family.Add({{"kind", "fallback_step"}})),
      deferred_samples(BuildGauge()
                           .Name("tutti_packer_deferred_samples")
                           .Help("Samples waiting for a later step after the last step planned")
                           .Register(r)
                           .Add({})),
      window_depth(BuildGauge()
                       .Name("tutti_packer_plan_window_depth")
                       .Help("Planned steps ready ahead of the furthest step a client asked for")
                       .Register(r)
                       .Add({})),
      client_step(BuildGauge()
                      .Name("tutti_packer_client_step")
                      .Help("The furthest step a client asked for")
                      .Register(r)
                      .Add({})),
      served_get(served_family.Add({{"rpc", "GetPlan"}})),
      served_stream(served_family.Add({{"rpc", "StreamPlans"}})),
      errors_invalid_argument(errors_family.Add({{"code", "invalid_argument"}})),
      errors_out_of_range(errors_family.Add({{"code", "out_of_range"}})),
      errors_failed_precondition(errors_family.Add({{"code", "failed_precondition"}})),
      errors_other(errors_family.Add({{"code", "other"}})),
      timing_accepted(timing_family.Add({{"result", "accepted"}})),
      timing_rejected(timing_family.Add({{"result", "rejected"}})),
      reported_phase_seconds(BuildHistogram()
                                 .Name("tutti_packer_reported_phase_seconds")
                                 .Help("Phase times reported by clients")
                                 .Register(r)),
      reported_data_wait(reported_phase_seconds.Add({{"phase", "data_wait"}}, LatencyBuckets())),
      reported_vit(reported_phase_seconds.Add({{"phase", "vit"}}, LatencyBuckets())),
      reported_llm(reported_phase_seconds.Add({{"phase", "llm"}}, LatencyBuckets())),
      reported_exchange(reported_phase_seconds.Add({{"phase", "exchange"}}, LatencyBuckets())),
      reported_step(reported_phase_seconds.Add({{"phase", "step"}}, LatencyBuckets())),
      reported_other(reported_phase_seconds.Add({{"phase", "other"}}, LatencyBuckets())),
      fitted_vit(fitted_family.Add({{"phase", "vit"}})),
      fitted_llm(fitted_family.Add({{"phase", "llm"}})),
      inter_node_bytes(BuildHistogram()
                           .Name("tutti_packer_exchange_inter_node_bytes")
                           .Help("Inter-node bytes of a step's encoder-output exchange")
                           .Register(r)
                           .Add({}, ByteBuckets())),
      intra_node_bytes(
          BuildHistogram()
              .Name("tutti_packer_exchange_intra_node_bytes")
              .Help("Bytes of a step's encoder-output exchange between ranks of a node")
              .Register(r)
              .Add({}, ByteBuckets())),
      remote_load_bytes(BuildHistogram()
                            .Name("tutti_packer_exchange_remote_load_bytes")
                            .Help("Bytes of a step's load exchange (inputs not staged on the node "
                                  "that needs them)")
                            .Register(r)
                            .Add({}, ByteBuckets())),
      rearrangement_family(BuildCounter()
                               .Name("tutti_packer_rearrangements_total")
                               .Help("Post-balanced steps by how the LLM placement was chosen")
                               .Register(r)),
      rearrangement_fast(rearrangement_family.Add({{"result", "fast"}})),
      rearrangement_ilp_optimal(rearrangement_family.Add({{"result", "ilp_optimal"}})),
      rearrangement_ilp_fast_kept(rearrangement_family.Add({{"result", "ilp_fast_kept"}})),
      index_samples(BuildGauge()
                        .Name("tutti_packer_index_samples")
                        .Help("Samples in the loaded index")
                        .Register(r)
                        .Add({})),
      index_bytes_family(BuildGauge()
                             .Name("tutti_packer_index_bytes")
                             .Help("The loaded index: its file mapped (page-cache pages) and what "
                                   "loading it allocated on the heap")
                             .Register(r)),
      per_sample_family(BuildGauge()
                            .Name("tutti_packer_memory_per_sample_bytes")
                            .Help("Mapped index bytes, and heap bytes of the index and the job "
                                  "built at load, per sample of the index")
                            .Register(r)),
      job_heap_bytes(BuildGauge()
                         .Name("tutti_packer_job_heap_bytes")
                         .Help("Heap the packer allocated building the job over the index")
                         .Register(r)
                         .Add({})),
      unplanned_family(BuildGauge()
                           .Name("tutti_packer_unplanned_samples")
                           .Help("Samples of the index left out of every plan because the stager "
                                 "would refuse them, by reason")
                           .Register(r)),
      served_cache_family(BuildCounter()
                              .Name("tutti_packer_served_plan_cache_total")
                              .Help("Plans asked for: served from the kept serialized plans "
                                    "(hit), after waiting for the same plan's build under way "
                                    "(joined) or built and serialized (miss)")
                              .Register(r)),
      served_cache_hits(served_cache_family.Add({{"result", "hit"}})),
      served_cache_joined(served_cache_family.Add({{"result", "joined"}})),
      served_cache_misses(served_cache_family.Add({{"result", "miss"}})),
      served_cache_bytes(BuildGauge()
                             .Name("tutti_packer_served_plan_cache_bytes")
                             .Help("Bytes of serialized plans kept to serve again")
                             .Register(r)
                             .Add({})),
      served_precomputed(BuildCounter()
                             .Name("tutti_packer_served_plans_precomputed_total")
                             .Help("Serialized plans built and kept when their step was planned, "
                                   "before any client asked for them")
                             .Register(r)
                             .Add({})),
      locality_items_family(BuildCounter()
                                .Name("tutti_packer_locality_items_total")
                                .Help("Inputs planned with locality: loaded where their shard is "
                                      "staged (local) or sent by a holder's stager (remote)")
                                .Register(r)),
      locality_local_items(locality_items_family.Add({{"load", "local"}})),
      locality_remote_items(locality_items_family.Add({{"load", "remote"}})),
      locality_remote_member_bytes(
          BuildHistogram()
              .Name("tutti_packer_locality_remote_member_bytes")
              .Help("Member bytes of a step's remote inputs, sent stager to stager")
              .Register(r)
              .Add({}, ByteBuckets())),
      locality_vit_over_lower_bound(
          BuildGauge()
              .Name("tutti_packer_locality_vit_over_lower_bound")
              .Help("The last step's slowest ViT rank over the phase's lower bound, with locality")
              .Register(r)
              .Add({})),
      locality_nodes_family(BuildGauge()
                                .Name("tutti_packer_locality_nodes")
                                .Help("Nodes by state in the latest shard homes (live, removed, "
                                      "silent, unreported)")
                                .Register(r)),
      locality_rehomings_family(BuildCounter()
                                    .Name("tutti_packer_locality_rehomings_total")
                                    .Help("Node changes announced from the stagers' reports, by "
                                          "reason (dead, returned, capacity)")
                                    .Register(r)),
      locality_rehomings_refused_family(
          BuildCounter()
              .Name("tutti_packer_locality_rehomings_refused_total")
              .Help("Node changes the packer could not take, by reason")
              .Register(r)),
      locality_change_from_step(BuildGauge()
                                    .Name("tutti_packer_locality_change_from_step")
                                    .Help("The step the latest node change is in force from")
                                    .Register(r)
                                    .Add({})),
      locality_node_cache_bytes(BuildGauge()
                                    .Name("tutti_packer_locality_node_cache_bytes")
                                    .Help("Per node: its reported cache capacity and bytes held, "
                                          "and the bytes the latest homes assign it")
                                    .Register(r)),
      locality_reports_family(BuildCounter()
                                  .Name("tutti_packer_locality_reports_total")
                                  .Help("Node reports from stagers, by result")
                                  .Register(r)),
      locality_reports_accepted(locality_reports_family.Add({{"result", "accepted"}})),
      locality_reports_rejected(locality_reports_family.Add({{"result", "rejected"}})),
      cost_fits_family(BuildCounter()
                           .Name("tutti_packer_cost_fits_total")
                           .Help("Online cost-fit rounds, by result")
                           .Register(r)),
      cost_fits_announced(cost_fits_family.Add({{"result", "announced"}})),
      cost_fits_unchanged(cost_fits_family.Add({{"result", "unchanged"}})),
      cost_fits_refused(cost_fits_family.Add({{"result", "refused"}})),
      cost_fit_from_step(BuildGauge()
                             .Name("tutti_packer_cost_fit_from_step")
                             .Help("Step from which the latest online cost fit is in force")
                             .Register(r)
                             .Add({})),
      cost_fit_constant(BuildGauge()
                            .Name("tutti_packer_cost_fit_constant")
                            .Help("Cost constants of the latest online fit")
                            .Register(r)),
      source_samples_family(BuildCounter()
                                .Name("tutti_packer_source_samples_total")
                                .Help("Samples of each source in the steps planned")
                                .Register(r)),
      source_epochs_family(BuildGauge()
                               .Name("tutti_packer_source_epochs")
                               .Help("Epochs of each source drawn by the furthest step planned")
                               .Register(r)) {
  SetUnplanned({});
}

void PackerMetrics::SetSources(const std::vector<std::string>& names) {
  source_samples_.clear();
  source_epochs_.clear();
  for (const std::string& name : names) {
    source_samples_.push_back(&source_samples_family.Add({{"source", name}}));
    source_epochs_.push_back(&source_epochs_family.Add({{"source", name}}));
  }
}

void PackerMetrics::SourcesPlanned(uint64_t step, const std::vector<uint32_t>& samples,
                                   const std::vector<double>& epochs) {
  for (size_t i = 0; i < samples.size() && i < source_samples_.size(); ++i) {
    if (samples[i] > 0) source_samples_[i]->Increment(samples[i]);
  }
  absl::MutexLock lock(&sources_mu_);
  if (any_step_ && step < furthest_step_) return;
  any_step_ = true;
  furthest_step_ = step;
  for (size_t i = 0; i < epochs.size() && i < source_epochs_.size(); ++i) {
    source_epochs_[i]->Set(epochs[i]);
  }
}

void PackerMetrics::SetMemory(uint64_t samples, uint64_t index_mapped, uint64_t index_heap,
                              uint64_t job_heap) {
  index_bytes_family.Add({{"memory", "mapped"}}).Set(static_cast<double>(index_mapped));
  index_bytes_family.Add({{"memory", "heap"}}).Set(static_cast<double>(index_heap));
  job_heap_bytes.Set(static_cast<double>(job_heap));
  const double n = static_cast<double>(std::max<uint64_t>(samples, 1));
  per_sample_family.Add({{"memory", "mapped"}}).Set(index_mapped / n);
  per_sample_family.Add({{"memory", "heap"}}).Set((index_heap + job_heap) / n);
}

void PackerMetrics::SetUnplanned(const std::map<std::string, uint64_t>& by_reason) {
  for (const char* reason : {"image_too_large", "too_many_images", "no_token_ids"}) {
    unplanned_family.Add({{"reason", reason}}).Set(0);
  }
  for (const auto& [reason, n] : by_reason) {
    unplanned_family.Add({{"reason", reason}}).Set(static_cast<double>(n));
  }
}

prometheus::Histogram& PackerMetrics::ReportedPhase(const std::string& phase) {
  if (phase == "data_wait") return reported_data_wait;
  if (phase == "vit") return reported_vit;
  if (phase == "llm") return reported_llm;
  if (phase == "exchange") return reported_exchange;
  if (phase == "step") return reported_step;
  return reported_other;
}

void PackerMetrics::CountError(int code) {
  switch (static_cast<absl::StatusCode>(code)) {
    case absl::StatusCode::kInvalidArgument:
      errors_invalid_argument.Increment();
      break;
    case absl::StatusCode::kOutOfRange:
      errors_out_of_range.Increment();
      break;
    case absl::StatusCode::kFailedPrecondition:
      errors_failed_precondition.Increment();
      break;
    default:
      errors_other.Increment();
      break;
  }
}

}  // namespace tutti::packer

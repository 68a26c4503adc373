// Every metric tutti-stagerd exports, declared in one place. The registry is
// injected (main creates the exposer); children are created once here.
#ifndef TUTTI_SERVICES_STAGER_METRICS_H_
#define TUTTI_SERVICES_STAGER_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace tutti::stager {

class StagerMetrics {
 public:
  explicit StagerMetrics(std::shared_ptr<prometheus::Registry> registry);
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // Staging (source -> node-local cache).
  prometheus::Counter& staged_bytes;        // tutti_stager_staged_bytes_total (throughput: its rate())
  prometheus::Counter& staged_files;        // tutti_stager_staged_files_total
  prometheus::Counter& staging_failures;    // tutti_stager_staging_failures_total
  // Cache.
  prometheus::Counter& cache_hits;          // tutti_stager_cache_hits_total
  prometheus::Counter& cache_misses;        // tutti_stager_cache_misses_total
  prometheus::Counter& cache_evictions;     // tutti_stager_cache_evictions_total
  prometheus::Gauge& cache_bytes;           // tutti_stager_cache_bytes
  prometheus::Gauge& cache_capacity;        // tutti_stager_cache_capacity_bytes
  // Reads of sample members and decodes.
  prometheus::Histogram& read_cache_seconds;   // tutti_stager_read_seconds{from="cache"}
  prometheus::Histogram& read_source_seconds;  // tutti_stager_read_seconds{from="source"}
  prometheus::Histogram& decode_seconds;       // tutti_stager_decode_seconds
  prometheus::Counter& decoded_images;         // tutti_stager_decoded_images_total
  prometheus::Counter& reduced_decodes;        // tutti_stager_reduced_jpeg_decodes_total
  prometheus::Counter& mislabelled_images;     // tutti_stager_mislabelled_images_total
  // Skipped sample members by reason (skip.h): corrupt, truncated, checksum, deadline, too_large,
  // missing, outside_root.
  prometheus::Counter& SkippedSamples(const std::string& reason);
  // Images refused by a bound of the job (also skipped as "too_large"), by
  // limit: source_pixels (vision.max_source_pixels / max_source_side, from
  // the header), image_pixels (planned above the step's max_pixels),
  // images_per_sample (vision.max_images_per_sample). The packer never plans
  // such a sample, so on an indexed dataset these stay 0:
  // tutti_stager_limit_refusals_total{limit}.
  prometheus::Counter& LimitRefusals(const std::string& limit);
  // Files not opened because their name leads outside --source or the cache:
  // tutti_stager_path_refusals_total{root,reason} (path_refusal.h).
  prometheus::Counter& PathRefused(const std::string& root, const std::string& reason);
  // Source and cache I/O by `io`: "staging" (copies into the cache),
  // "source" (member reads from the source), "cache" (member reads from the
  // cache). Operations that missed their deadline, by where they waited:
  // "file_system" (sent, not answered in time) or "queue" (never sent: the
  // stager's I/O thread ran late or its queue was full):
  // tutti_stager_io_timeouts_total{io,waited}.
  prometheus::Counter& IoTimeouts(const std::string& io, const std::string& waited);
  // Operations that timed out and have not returned (each holds a worker of
  // its I/O service and a buffer): tutti_stager_io_stalled_operations{io}.
  prometheus::Gauge& IoStalledOperations(const std::string& io);
  // Operations refused at once because their file's bound is held by
  // stalled ones (the file stalls): tutti_stager_io_stalled_refusals_total{io}.
  prometheus::Counter& IoStalledRefusals(const std::string& io);
  prometheus::Counter& placeholder_samples;  // tutti_stager_placeholder_samples_total
  prometheus::Counter& checksum_rereads;     // tutti_stager_checksum_rereads_total
  prometheus::Counter& dropped_samples;      // tutti_stager_dropped_samples_total
  prometheus::Counter& remote_load_images;   // tutti_stager_remote_load_images_total
  // Bytes read from --source (staging copies and member reads, the reads for
  // another node's stager included): tutti_stager_source_bytes_total.
  prometheus::Counter& source_bytes;
  // Member bytes moved stager to stager (FetchMembers):
  // tutti_stager_peer_bytes_total{direction="sent"|"received"}.
  prometheus::Counter& peer_bytes_sent;
  prometheus::Counter& peer_bytes_received;
  // Members of remote_load items asked of their holder's stager, by outcome:
  // received, or fallback (the holder did not deliver in time, refused,
  // failed, or sent bytes that fail the index's checksum; read from the
  // source instead): tutti_stager_peer_members_total{outcome}.
  prometheus::Counter& peer_members_received;
  prometheus::Counter& peer_fallbacks;
  // Members served to other nodes' stagers, by outcome:
  // tutti_stager_peer_served_members_total{outcome="sent"|"failed"}.
  prometheus::Counter& peer_served;
  prometheus::Counter& peer_served_failed;
  // FetchMembers calls of other nodes' stagers admitted (each names up to
  // 64 members of one shard): tutti_stager_peer_served_calls_total.
  prometheus::Counter& peer_served_calls;
  // Window and clients.
  // tutti_stager_window_batches{rank}: the local rank's batches ready ahead
  // of it (built, not yet handed out); one series per local rank.
  prometheus::Gauge& WindowBatches(uint32_t rank);
  prometheus::Gauge& window_building;        // tutti_stager_window_building_batches
  prometheus::Gauge& batch_memory;           // tutti_stager_batch_memory_bytes
  prometheus::Counter& batches_built;        // tutti_stager_batches_built_total
  prometheus::Histogram& batch_build_seconds;  // tutti_stager_batch_build_seconds
  // How long a rank waited for its batch, measured by the rank (libtutti's
  // Next(), reported with ReleaseBatch): tutti_stager_client_wait_seconds.
  prometheus::Histogram& client_wait_seconds;
  // How long AcquireBatch waited inside the stager for the batch to be ready:
  // tutti_stager_acquire_wait_seconds (0 when it was ready ahead).
  prometheus::Histogram& acquire_wait_seconds;
  // Leases (clients that renew them): holds freed when their lease lapsed,
  // and ranks taken as gone for want of any call within the lease.
  prometheus::Counter& leases_expired;       // tutti_stager_leases_expired_total
  prometheus::Counter& ranks_lapsed;         // tutti_stager_ranks_lapsed_total
  prometheus::Counter& plans_received;       // tutti_stager_plans_received_total
  prometheus::Counter& packer_reconnects;    // tutti_stager_packer_reconnects_total

 private:
  std::shared_ptr<prometheus::Registry> registry_;  // keeps the families alive
  prometheus::Family<prometheus::Counter>& skipped_family_;
  prometheus::Family<prometheus::Counter>& limit_family_;
  prometheus::Family<prometheus::Gauge>& window_family_;
  prometheus::Family<prometheus::Counter>& path_refused_family_;
  prometheus::Family<prometheus::Counter>& io_timeouts_family_;
  prometheus::Family<prometheus::Gauge>& io_stalled_family_;
  prometheus::Family<prometheus::Counter>& io_refusals_family_;
};

// The `io` label values of the Io* metrics.
inline constexpr const char* kIoPaths[] = {"staging", "source", "cache"};

}  // namespace tutti::stager

#endif  // TUTTI_SERVICES_STAGER_METRICS_H_

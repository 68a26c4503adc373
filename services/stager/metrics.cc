#include "services/stager/metrics.h"

#include "common/latency_buckets.h"
#include "services/stager/decode/skip.h"
#include "services/stager/staging/path_refusal.h"

namespace tutti::stager {
namespace {

// The bounds of LimitRefusals, created at start so each reads 0 until used.
constexpr const char* kLimits[] = {"source_pixels", "image_pixels", "images_per_sample"};

using prometheus::Registry;

prometheus::Counter& Counter(Registry& r, const std::string& name, const std::string& help,
                             const prometheus::Labels& labels = {}) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}
prometheus::Gauge& Gauge(Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}
prometheus::Histogram& Latency(Registry& r, const std::string& name, const std::string& help,
                               const prometheus::Labels& labels = {}) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add(
      labels, prometheus::Histogram::BucketBoundaries(LatencyBuckets()));
}

}  // namespace

StagerMetrics::StagerMetrics(std::shared_ptr<Registry> registry)
    : staged_bytes(Counter(*registry, "tutti_stager_staged_bytes_total",
                           "Bytes copied from the source directory into the node-local cache")),
      staged_files(
          Counter(*registry, "tutti_stager_staged_files_total",
                  "Shards copied into the node-local cache, verified and renamed into place")),
      staging_failures(
          Counter(*registry, "tutti_stager_staging_failures_total",
                  "Shards whose staging failed (missing, unreadable, changed, corrupt, "
                  "cache full, deadline)")),
      cache_hits(Counter(*registry, "tutti_stager_cache_hits_total",
                         "Shard requests served by a shard already in the cache")),
      cache_misses(Counter(*registry, "tutti_stager_cache_misses_total",
                           "Shard requests that needed a copy from the source")),
      cache_evictions(Counter(*registry, "tutti_stager_cache_evictions_total",
                              "Shards removed from the cache to make room")),
      cache_bytes(Gauge(*registry, "tutti_stager_cache_bytes", "Bytes of shards in the cache")),
      cache_capacity(Gauge(*registry, "tutti_stager_cache_capacity_bytes", "Cache byte capacity")),
      read_cache_seconds(Latency(*registry, "tutti_stager_read_seconds",
                                 "Latency of reading one sample member", {{"from", "cache"}})),
      read_source_seconds(prometheus::BuildHistogram()
                              .Name("tutti_stager_read_seconds")
                              .Help("Latency of reading one sample member")
                              .Register(*registry)
                              .Add({{"from", "source"}},
                                   prometheus::Histogram::BucketBoundaries(LatencyBuckets()))),
      decode_seconds(Latency(*registry, "tutti_stager_decode_seconds",
                             "Decode + resize + normalise + patchify time of one image")),
      decoded_images(Counter(*registry, "tutti_stager_decoded_images_total", "Images decoded")),
      reduced_decodes(Counter(*registry, "tutti_stager_reduced_jpeg_decodes_total",
                              "JPEG decodes done at 1/2, 1/4 or 1/8 scale in the DCT domain")),
      mislabelled_images(Counter(*registry, "tutti_stager_mislabelled_images_total",
                                 "Images whose content format differs from their name")),
      placeholder_samples(Counter(*registry, "tutti_stager_placeholder_samples_total",
                                  "Skipped samples kept at their planned shape with placeholder "
                                  "content, to be masked out of the loss (the substitute policy, "
                                  "or a sample that crosses ranks under the drop policy)")),
      checksum_rereads(Counter(*registry, "tutti_stager_checksum_rereads_total",
                               "Members whose bytes failed the index's checksum and were read "
                               "again from the source")),
      dropped_samples(Counter(*registry, "tutti_stager_dropped_samples_total",
                              "Samples removed from a batch under the drop policy")),
      remote_load_images(Counter(*registry, "tutti_stager_remote_load_images_total",
                                 "Images the plan marks remote_load (their shard is not staged "
                                 "on this node), read from the source directly")),
      source_bytes(Counter(*registry, "tutti_stager_source_bytes_total",
                           "Bytes read from the source directory: staging copies and member "
                           "reads, those for other nodes' stagers included")),
      peer_bytes_sent(Counter(*registry, "tutti_stager_peer_bytes_total",
                              "Member bytes moved stager to stager (FetchMembers), by direction",
                              {{"direction", "sent"}})),
      peer_bytes_received(
          Counter(*registry, "tutti_stager_peer_bytes_total",
                  "Member bytes moved stager to stager (FetchMembers), by direction",
                  {{"direction", "received"}})),
      peer_members_received(Counter(*registry, "tutti_stager_peer_members_total",
                                    "Members of remote_load items asked of their holder's stager, "
                                    "by outcome: received, or fallback (read from the source)",
                                    {{"outcome", "received"}})),
      peer_fallbacks(Counter(*registry, "tutti_stager_peer_members_total",
                             "Members of remote_load items asked of their holder's stager, "
                             "by outcome: received, or fallback (read from the source)",
                             {{"outcome", "fallback"}})),
      peer_served(Counter(*registry, "tutti_stager_peer_served_members_total",
                          "Members served to other nodes' stagers, by outcome: sent, failed",
                          {{"outcome", "sent"}})),
      peer_served_failed(Counter(*registry, "tutti_stager_peer_served_members_total",
                                 "Members served to other nodes' stagers, by outcome: sent, failed",
                                 {{"outcome", "failed"}})),
      peer_served_calls(Counter(*registry, "tutti_stager_peer_served_calls_total",
                                "FetchMembers calls of other nodes' stagers admitted (each names up "
                                "to 64 members of one shard)")),
      window_building(Gauge(*registry, "tutti_stager_window_building_batches",
                            "Batches being read and decoded")),
      batch_memory(Gauge(*registry, "tutti_stager_batch_memory_bytes",
                         "Shared memory held by batches (ready and building)")),
      batches_built(Counter(*registry, "tutti_stager_batches_built_total", "Batches made ready")),
      batch_build_seconds(Latency(*registry, "tutti_stager_batch_build_seconds",
                                  "Time from starting a batch to it being ready")),
      client_wait_seconds(Latency(*registry, "tutti_stager_client_wait_seconds",
                                  "Time a rank waited for its batch, as the rank measured it "
                                  "(reported with ReleaseBatch)")),
      acquire_wait_seconds(Latency(*registry, "tutti_stager_acquire_wait_seconds",
                                   "Time AcquireBatch waited in the stager for the batch to be "
                                   "ready (0 when it was ready ahead)")),
      leases_expired(Counter(*registry, "tutti_stager_leases_expired_total",
                             "Batches freed because the lease of the client holding them lapsed "
                             "(not renewed in time, or its rank taken as gone)")),
      ranks_lapsed(Counter(*registry, "tutti_stager_ranks_lapsed_total",
                           "Times a local rank's process was not heard from within its lease and "
                           "was taken as gone (the window then stops waiting for it)")),
      plans_received(Counter(*registry, "tutti_stager_plans_received_total",
                             "Step plans received from the packer")),
      packer_reconnects(Counter(*registry, "tutti_stager_packer_reconnects_total",
                                "Times the plan stream from the packer was re-established")),
      registry_(registry),
      skipped_family_(prometheus::BuildCounter()
                          .Name("tutti_stager_skipped_samples_total")
                          .Help("Sample members skipped, by reason: corrupt, truncated, "
                                "checksum, deadline, too_large, missing, outside_root")
                          .Register(*registry)),
      limit_family_(prometheus::BuildCounter()
                        .Name("tutti_stager_limit_refusals_total")
                        .Help("Images refused by a bound of the job, by limit: source_pixels, "
                              "image_pixels, images_per_sample (0 when every plan keeps them)")
                        .Register(*registry)),
      window_family_(prometheus::BuildGauge()
                         .Name("tutti_stager_window_batches")
                         .Help("Batches of a local rank ready ahead of it: built, not yet "
                               "handed out (the prefetch window's occupancy)")
                         .Register(*registry)),
      path_refused_family_(prometheus::BuildCounter()
                               .Name("tutti_stager_path_refusals_total")
                               .Help("Files not opened because their name leads outside --source "
                                     "or the cache, by root and reason: outside (a symlink or "
                                     "'..' out of it), loop, name (absolute or '..')")
                               .Register(*registry)),
      io_timeouts_family_(prometheus::BuildCounter()
                              .Name("tutti_stager_io_timeouts_total")
                              .Help("File operations that missed their deadline, by io (staging, "
                                    "source, cache) and where they waited: file_system (sent, "
                                    "not answered in time) or queue (never sent: the stager's I/O "
                                    "thread ran late, short of CPU, or its queue was full)")
                              .Register(*registry)),
      io_stalled_family_(prometheus::BuildGauge()
                             .Name("tutti_stager_io_stalled_operations")
                             .Help("File operations that timed out and have not returned, by io "
                                   "(each holds a worker and a buffer; a file holds at most its "
                                   "bound of them)")
                             .Register(*registry)),
      io_refusals_family_(prometheus::BuildCounter()
                              .Name("tutti_stager_io_stalled_refusals_total")
                              .Help("File operations refused at once, by io, because their file's "
                                    "bound is held by stalled operations (the file stalls)")
                              .Register(*registry)) {
  for (const char* reason : kSkipReasons) SkippedSamples(reason);
  for (const char* limit : kLimits) LimitRefusals(limit);
  for (const char* root : kPathRoots) {
    for (const char* reason : kPathRefusalReasons) PathRefused(root, reason);
  }
  for (const char* io : kIoPaths) {
    IoTimeouts(io, "file_system");
    IoTimeouts(io, "queue");
    IoStalledOperations(io);
    IoStalledRefusals(io);
  }
}

prometheus::Counter& StagerMetrics::IoTimeouts(const std::string& io, const std::string& waited) {
  return io_timeouts_family_.Add({{"io", io}, {"waited", waited}});
}

prometheus::Gauge& StagerMetrics::IoStalledOperations(const std::string& io) {
  return io_stalled_family_.Add({{"io", io}});
}

prometheus::Counter& StagerMetrics::IoStalledRefusals(const std::string& io) {
  return io_refusals_family_.Add({{"io", io}});
}

prometheus::Counter& StagerMetrics::PathRefused(const std::string& root,
                                                const std::string& reason) {
  return path_refused_family_.Add({{"root", root}, {"reason", reason}});
}

prometheus::Gauge& StagerMetrics::WindowBatches(uint32_t rank) {
  return window_family_.Add({{"rank", std::to_string(rank)}});
}

prometheus::Counter& StagerMetrics::LimitRefusals(const std::string& limit) {
  return limit_family_.Add({{"limit", limit}});
}

prometheus::Counter& StagerMetrics::SkippedSamples(const std::string& reason) {
  return skipped_family_.Add({{"reason", reason}});
}

}  // namespace tutti::stager

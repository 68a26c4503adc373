#include "services/packer/bench/nfs_egress.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/byte_size.h"
#include "common/status.h"
#include "services/packer/core/planner.h"

namespace tutti::packer {

namespace {

// Decimal bytes, 1 decimal: "58810.3 TB", "16.0 GB".
std::string Bytes(double b) {
  if (b >= 1e12) return absl::StrFormat("%.1f TB", b / 1e12);
  if (b >= 1e9) return absl::StrFormat("%.1f GB", b / 1e9);
  return absl::StrFormat("%.1f MB", b / 1e6);
}

}  // namespace

bool LruShardCache::Touch(uint32_t shard, uint64_t bytes) {
  if (auto it = where_.find(shard); it != where_.end()) {
    order_.splice(order_.begin(), order_, it->second);
    return true;
  }
  ++reads_;
  read_bytes_ += bytes;
  if (bytes > capacity_) return false;
  while (held_ + bytes > capacity_) {
    held_ -= order_.back().second;
    where_.erase(order_.back().first);
    order_.pop_back();
  }
  order_.emplace_front(shard, bytes);
  where_[shard] = order_.begin();
  held_ += bytes;
  return false;
}

absl::Status StepShardReads(const StepPlanData& d, uint32_t rpn, uint32_t nodes,
                            std::vector<std::vector<uint32_t>>* per_node) {
  per_node->resize(nodes);
  for (auto& v : *per_node) v.clear();
  std::vector<absl::flat_hash_set<uint32_t>> seen(nodes);
  for (uint32_t item = 0; item < d.num_load_items(); ++item) {
    const uint32_t rank = d.IsRemoteLoad(item) ? d.LoadSource(item) : d.LoadDest(item);
    const uint32_t node = rank / rpn;
    if (node >= nodes) {
      return absl::InternalError(absl::StrCat("step ", d.step, ": load item ", item, " on rank ",
                                              rank, ", outside the ", nodes, " nodes"));
    }
    const uint32_t shard = d.samples[d.LoadOwner(item)].shard;
    if (seen[node].insert(shard).second) (*per_node)[node].push_back(shard);
  }
  return absl::OkStatus();
}

EgressCounter::EgressCounter(std::vector<uint64_t> shard_bytes, uint32_t nodes,
                             uint32_t ranks_per_node, const std::vector<uint64_t>& cache_bytes)
    : shard_bytes_(std::move(shard_bytes)),
      nodes_(nodes),
      rpn_(ranks_per_node),
      caches_(cache_bytes.size()) {
  lru_.reserve(size_t{nodes} * caches_);
  for (uint32_t n = 0; n < nodes; ++n) {
    for (uint64_t c : cache_bytes) lru_.emplace_back(c);
  }
}

absl::Status EgressCounter::AddStep(const StepPlanData& d) {
  RETURN_IF_ERROR(StepShardReads(d, rpn_, nodes_, &scratch_));
  for (uint32_t n = 0; n < nodes_; ++n) {
    reads_ += scratch_[n].size();
    for (uint32_t shard : scratch_[n]) {
      if (shard >= shard_bytes_.size()) {
        return absl::InternalError(absl::StrCat("shard ", shard, " is not in the index"));
      }
      for (size_t c = 0; c < caches_; ++c) lru_[n * caches_ + c].Touch(shard, shard_bytes_[shard]);
    }
  }
  ++steps_;
  return absl::OkStatus();
}

std::vector<uint64_t> EgressCounter::source_bytes() const {
  std::vector<uint64_t> out(caches_, 0);
  for (size_t i = 0; i < lru_.size(); ++i) out[i % caches_] += lru_[i].read_bytes();
  return out;
}

double EgressCounter::shards_per_node_step() const {
  return steps_ == 0 || nodes_ == 0 ? 0 : static_cast<double>(reads_) / steps_ / nodes_;
}

absl::StatusOr<std::vector<double>> ParseCacheSizes(absl::string_view text,
                                                    uint64_t dataset_bytes) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    part = absl::StripAsciiWhitespace(part);
    double f = 0;
    if (!part.empty() && absl::StrContains("KMGTkmgt", part.back())) {
      uint64_t bytes = 0;
      if (!ParseByteSize(part, &bytes) || bytes == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cache size '", part, "' is not a size such as 312G (binary multiples K/M/G/T)"));
      }
      if (bytes > dataset_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("cache size '", part, "' (", bytes, " bytes) is larger than the dataset (",
                         dataset_bytes, " bytes): a node holds at most the whole dataset"));
      }
      f = static_cast<double>(bytes) / static_cast<double>(dataset_bytes);
    } else {
      std::pair<absl::string_view, absl::string_view> p = absl::StrSplit(part, '/');
      double a = 0, b = 1;
      if (!absl::SimpleAtod(p.first, &a) ||
          (!p.second.empty() && !absl::SimpleAtod(p.second, &b))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cache size '", part,
            "' is neither a fraction of the dataset (1/32, 0.125) nor a size such as 312G"));
      }
      f = a / b;
      if (!(f > 0 && f <= 1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cache size '", part,
            "' is not a fraction of the dataset in (0, 1] (1: the whole dataset a node; more "
            "holds nothing more): give one such as 1/32 or a size with a unit such as 312G"));
      }
    }
    out.push_back(f);
  }
  if (out.empty()) return absl::InvalidArgumentError("no cache size given (e.g. 1/32,1/8,1)");
  return out;
}

absl::StatusOr<EgressSetup> MakeEgressSetup(const EgressOptions& o) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  const uint32_t W = o.world_size;
  const uint32_t rpn = std::min(W, o.workload.ranks_per_node);
  if (W == 0 || rpn == 0 || W % rpn != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", W, " is not a positive multiple of ", rpn, " ranks per node"));
  }
  if (o.shard_bytes == 0 || o.dataset_bytes < o.shard_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the dataset (", o.dataset_bytes,
                                                   " bytes) must hold at least one shard (",
                                                   o.shard_bytes, " bytes)"));
  }
  if (o.dataset_bytes / o.shard_bytes > 10'000'000) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the dataset is ", o.dataset_bytes / o.shard_bytes, " shards: at most 10,000,000"));
  }
  if (o.replication == 0 || o.replication > W / rpn) {
    return absl::InvalidArgumentError(
        absl::StrCat("replication ", o.replication, " is not in 1..", W / rpn, " (the nodes)"));
  }
  if (o.cache_fractions.empty()) return absl::InvalidArgumentError("no cache size given");
  for (double f : o.cache_fractions) {
    if (!(f > 0 && f <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cache fraction ", f, " is not in (0, 1] of the dataset"));
    }
  }
  EgressSetup s;
  s.world_size = W;
  s.ranks_per_node = rpn;
  s.nodes = W / rpn;
  const uint64_t shards = (o.dataset_bytes + o.shard_bytes - 1) / o.shard_bytes;
  const uint64_t wanted =
      o.samples > 0 ? o.samples
                    : uint64_t{W} * o.workload.seqs_per_rank * o.workload.seq_len / 1000 * 5;
  SeedWorkloadOptions wl = o.workload;
  wl.ranks_per_node = rpn;
  wl.samples_per_shard = static_cast<uint32_t>(std::max<uint64_t>(1, wanted / shards));
  const uint64_t samples = uint64_t{wl.samples_per_shard} * shards;
  say(absl::StrCat("dataset: ", samples, " synthetic samples in ", shards, " shards"));
  ASSIGN_OR_RETURN(s.index, MakeSeedIndex(wl, samples));
  ASSIGN_OR_RETURN(s.shape, SeedShape(wl, *s.index, W, o.max_pixels));
  s.shards = s.index->num_shards();

  // The bytes of the members a sample holds, on average: what the dataset's
  // size in samples is computed from.
  double member_bytes = 0;
  for (uint32_t i = 0; i < s.index->num_samples(); ++i) {
    member_bytes += s.index->text_size(i);
    for (uint32_t j = s.index->media_begin(i); j < s.index->media_end(i); ++j) {
      member_bytes += s.index->media(j).size;
    }
  }
  const double bytes_per_sample = member_bytes / std::max<uint32_t>(1, s.index->num_samples());
  const double per_step = s.shape.text_samples + s.shape.vl_samples;
  s.epoch_steps = o.dataset_bytes / bytes_per_sample / per_step;

  v1::JobConfig today = SeedConfig(wl, s.shape, W, o.max_pixels, "tutti", 6, true);
  if (o.balance_tolerance >= 0) {
    today.mutable_post_balancing()->set_balance_tolerance(o.balance_tolerance);
  }
  // Capacities are fractions of the index's own bytes (every synthetic shard
  // has one size, so a fraction of the dataset is the same number of shards).
  s.index_bytes = static_cast<double>(s.index->dataset_bytes());
  std::vector<ShardKey> keys;
  for (const IndexShard& sh : s.index->shards()) keys.push_back({sh.name, sh.size});
  double smallest = 0;
  for (double f : o.cache_fractions) {
    ShardHomesOptions ho;
    ho.replication = o.replication;
    ho.node_capacity_bytes = static_cast<uint64_t>(std::ceil(f * s.index_bytes));
    ho.seed = today.seed();
    absl::StatusOr<ShardHomes> homes = ShardHomes::Assign(keys, s.nodes, ho);
    if (!homes.ok()) {
      // Said in the dataset's bytes (the index's are synthetic).
      const double need = static_cast<double>(o.replication) * o.dataset_bytes;
      const double cache = f * o.dataset_bytes;
      homes = absl::ResourceExhaustedError(
          need > cache * s.nodes
              ? absl::StrCat(o.replication, " copies of the dataset need ", Bytes(need), " but ",
                             s.nodes, " nodes' caches of ", Bytes(cache), " hold ",
                             Bytes(cache * s.nodes),
                             "; raise the cache, lower the replication or add nodes")
              : absl::StrCat(o.replication, " copies of the dataset (", Bytes(need),
                             ") placed as whole shards leave a shard without ", o.replication,
                             " nodes with room in caches of ", Bytes(cache),
                             "; raise the cache, lower the replication or add nodes"));
    }
    s.homes.push_back(std::move(homes));
    if (s.homes.back().ok() && (smallest == 0 || f < smallest)) smallest = f;
  }
  if (smallest == 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat("no cache size given holds the homes: ", s.homes.back().status().message()));
  }
  // The smallest cache that holds the homes plans the locality job (the
  // homes differ only where a capacity binds).
  v1::JobConfig local = today;
  local.mutable_locality()->set_home_replication(o.replication);
  local.mutable_locality()->set_node_cache_bytes(
      static_cast<uint64_t>(std::ceil(smallest * s.index_bytes)));
  say("jobs: post-balancing with and without locality");
  ASSIGN_OR_RETURN(s.today, Job::Create(today, s.index));
  ASSIGN_OR_RETURN(s.local, Job::Create(local, s.index));
  return s;
}

absl::StatusOr<EgressResult> CountEgress(const EgressSetup& s, const EgressOptions& o) {
  EgressResult r;
  r.ranks = s.world_size;
  r.nodes = s.nodes;
  r.shards = s.shards;
  r.replication = s.local->homes()->HomesAt(0).replication();
  r.samples_per_step = s.shape.text_samples + s.shape.vl_samples;
  r.index_samples = s.index->num_samples();
  r.epoch_steps = s.epoch_steps;
  r.counted_steps = o.count_steps > 0
                        ? o.count_steps
                        : static_cast<uint64_t>(std::max(1.0, std::ceil(s.epoch_steps)));
  if (s.today->total_steps() != 0 && s.today->total_steps() < r.counted_steps) {
    return absl::InvalidArgumentError("the synthetic index's job ends before the counted steps");
  }
  std::vector<uint64_t> shard_bytes, caches;
  for (const IndexShard& sh : s.index->shards()) shard_bytes.push_back(sh.size);
  for (double f : o.cache_fractions) {
    caches.push_back(static_cast<uint64_t>(std::ceil(f * s.index_bytes)));
  }
  EgressCounter today(shard_bytes, s.nodes, s.ranks_per_node, caches);
  EgressCounter local(shard_bytes, s.nodes, s.ranks_per_node, caches);
  const Planner today_planner(s.today), local_planner(s.local);
  StepPlanData d;
  for (uint64_t step = 0; step < r.counted_steps; ++step) {
    if (o.progress && (step % 25 == 0 || step + 1 == r.counted_steps)) {
      o.progress(absl::StrCat("egress: step ", step + 1, " of ", r.counted_steps,
                              ", every node's stager cache in plan order"));
    }
    RETURN_IF_ERROR(today_planner.Plan(step, &d));
    RETURN_IF_ERROR(today.AddStep(d));
    RETURN_IF_ERROR(local_planner.Plan(step, &d));
    RETURN_IF_ERROR(local.AddStep(d));
  }
  r.shards_per_node_step = today.shards_per_node_step();
  r.shards_per_node_step_locality = local.shards_per_node_step();
  const std::vector<uint64_t> today_bytes = today.source_bytes();
  const std::vector<uint64_t> local_bytes = local.source_bytes();
  // The index's bytes scaled to the dataset's.
  const double scale = static_cast<double>(o.dataset_bytes) / s.index_bytes;
  for (size_t i = 0; i < o.cache_fractions.size(); ++i) {
    EgressRow row;
    row.cache_fraction = o.cache_fractions[i];
    row.cache_bytes_per_node = row.cache_fraction * static_cast<double>(o.dataset_bytes);
    row.limit_bytes = static_cast<double>(r.replication) * static_cast<double>(o.dataset_bytes);
    row.nfs_today_bytes = static_cast<double>(today_bytes[i]) * scale;
    if (s.homes[i].ok()) {
      row.nfs_locality_bytes = static_cast<double>(local_bytes[i]) * scale;
    } else {
      row.error = std::string(s.homes[i].status().message());
    }
    r.rows.push_back(row);
  }
  return r;
}

std::string FormatEgressTable(const EgressResult& r) {
  const bool epoch =
      r.counted_steps == static_cast<uint64_t>(std::max(1.0, std::ceil(r.epoch_steps)));
  std::string out = absl::StrFormat(
      "NFS egress %s: every node's stager an LRU cache of the given size over the shards its "
      "plans name, in plan order, counted over %u planned steps of %u nodes (an epoch is %.1f "
      "steps); shards a node reads a step: %.1f today, %.1f with homes\n",
      epoch ? "per epoch" : "over the counted steps (not an epoch)",
      static_cast<unsigned>(r.counted_steps), r.nodes, r.epoch_steps, r.shards_per_node_step,
      r.shards_per_node_step_locality);
  absl::StrAppend(&out,
                  absl::StrFormat("%-8s %14s %16s %16s %14s %12s %12s\n", "cache", "cache/node",
                                  "NFS today", "NFS homes", "limit rD", "today/rD", "homes/rD"));
  for (const EgressRow& row : r.rows) {
    if (!row.error.empty()) {
      absl::StrAppend(&out, absl::StrFormat("%-8.4g %14s %16s  homes refused: %s\n",
                                            row.cache_fraction, Bytes(row.cache_bytes_per_node),
                                            Bytes(row.nfs_today_bytes), row.error));
      continue;
    }
    absl::StrAppend(
        &out, absl::StrFormat("%-8.4g %14s %16s %16s %14s %12.1f %12.3f\n", row.cache_fraction,
                              Bytes(row.cache_bytes_per_node), Bytes(row.nfs_today_bytes),
                              Bytes(row.nfs_locality_bytes), Bytes(row.limit_bytes),
                              row.nfs_today_bytes / row.limit_bytes,
                              row.nfs_locality_bytes / row.limit_bytes));
  }
  return out;
}

std::string FormatEgressJsonFields(const EgressResult& r) {
  std::string rows;
  for (const EgressRow& row : r.rows) {
    absl::StrAppend(
        &rows, rows.empty() ? "" : ",",
        absl::StrFormat("{\"cache_fraction\":%.6g,\"cache_bytes_per_node\":%.6g,"
                        "\"nfs_today_bytes\":%.6g,\"nfs_locality_bytes\":%.6g,"
                        "\"limit_bytes\":%.6g,\"error\":\"%s\"}",
                        row.cache_fraction, row.cache_bytes_per_node, row.nfs_today_bytes,
                        row.nfs_locality_bytes, row.limit_bytes, row.error));
  }
  return absl::StrFormat(
      "\"ranks\":%u,\"nodes\":%u,\"shards\":%u,\"replication\":%u,\"samples_per_step\":%u,"
      "\"epoch_steps\":%.6g,\"counted_steps\":%u,\"shards_per_node_step_today\":%.6g,"
      "\"shards_per_node_step_locality\":%.6g,\"rows\":[%s]",
      r.ranks, r.nodes, r.shards, r.replication, static_cast<unsigned>(r.samples_per_step),
      r.epoch_steps, static_cast<unsigned>(r.counted_steps), r.shards_per_node_step,
      r.shards_per_node_step_locality, rows);
}

}  // namespace tutti::packer

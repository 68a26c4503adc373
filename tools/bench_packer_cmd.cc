// `tutti bench packer`: every packing strategy side by side on the seed's
// workload, in one run: plan time, ViT/LLM imbalance (and vs. the lower
// bound), image-token spread per pack. Also measures loading a large index.
#include <google/protobuf/text_format.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "services/packer/bench/bench_workload.h"
#include "services/packer/bench/mixture_dataset.h"
#include "services/packer/bench/synthetic.h"
#include "services/packer/core/job.h"
#include "services/packer/core/partition_bound.h"
#include "services/packer/core/planner.h"
#include "services/packer/core/seed_stream.h"
#include "services/packer/index/index.h"
#include "services/packer/plan_proto.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/stats.h"

namespace tutti::tools {
namespace {

using Clock = std::chrono::steady_clock;
double Ms(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// CPU time of the calling thread: plan times are "one core" times, and do
// not count time the thread spent waiting for a CPU on a busy machine.
double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Per-step quality numbers of one plan.
struct StepQuality {
  double vit = 0, vit_lb = 0, llm = 0, llm_lb = 0, tokens = 0, img_std = 0, img_mean = 0;
  double vit_drawn = 0, llm_drawn = 0;
  // Max over the partition bound (partition_bound.h) of each phase.
  double vit_pb = 0, llm_pb = 0;
  // Bytes between nodes: the forward exchange's and the load exchange's.
  double inter_node_bytes = 0, remote_load_bytes = 0;
};

struct Cell {
  std::string strategy;
  uint32_t bins = 0;      // open bins (seed strategies)
  double tolerance = -1;  // post_balancing.balance_tolerance of tutti's cells; < 0: default
  uint32_t ranks = 0;
  uint64_t max_pixels = 0;
  uint32_t seq_len = 0;
  packer::SeedStepShape shape;
  uint32_t steps = 0, failed = 0;  // steps averaged over (planned by every strategy), failed
  std::vector<double> plan_ms, build_ms;
  std::vector<std::optional<StepQuality>> per_step;  // unset: the step failed
  StepQuality mean;
  std::string error;
  // A mixture (MixtureConfig text) the cell's job draws through; empty: the
  // two streams. `sources`: how many it names.
  std::string mixture;
  uint32_t sources = 0;
  double resume_ms = 0;  // a fresh planner's first plan of --resume-step
};

// The slowest rank over the partition bound of the phase's items: the ViT
// cost of each VL sample with its tokens, which share the rank's VL
// sequences (of each image alone when post-balancing deals images one by
// one), the LLM cost of each sample with its tokens, which share all of the
// rank's sequences.
double OverPartitionBound(const packer::StepPlanData& d, bool vit, bool per_image) {
  const packer::PhaseSummary& ph = vit ? d.vit : d.llm;
  double bound = 0;
  if (vit && per_image) {
    std::vector<double> items;
    for (const auto& im : d.images) items.push_back(im.cost);
    bound = packer::PartitionLowerBound(std::move(items), d.world_size, ph.max);
  } else {
    std::vector<std::pair<double, double>> items;
    for (const auto& ps : d.samples) {
      if (vit && !ps.vl) continue;
      items.emplace_back(vit ? ps.cost.vit : ps.cost.llm, ps.cost.llm_tokens);
    }
    const double room = static_cast<double>(d.seq_len) * (vit ? d.vl_seqs : d.seqs_per_rank());
    bound = packer::PartitionLowerBound(items, d.world_size, room, ph.max);
  }
  return bound > 0 ? ph.max / bound : 1;
}

// Per-step quality numbers from a plan.
StepQuality Measure(const packer::StepPlanData& d, bool partition_bound, bool per_image) {
  StepQuality q;
  const uint32_t W = d.world_size, S = d.seqs_per_rank();
  double tmax = 0, tsum = 0;
  for (const auto& r : d.ranks) {
    tmax = std::max<double>(tmax, r.llm_tokens);
    tsum += r.llm_tokens;
  }
  q.tokens = tsum > 0 ? tmax / (tsum / W) : 1;
  q.vit = d.vit.imbalance;
  q.vit_lb = d.vit.lower_bound > 0 ? d.vit.max / d.vit.lower_bound : 1;
  q.llm = d.llm.imbalance;
  q.llm_lb = d.llm.lower_bound > 0 ? d.llm.max / d.llm.lower_bound : 1;
  q.vit_drawn = d.vit.imbalance_before;
  q.llm_drawn = d.llm.imbalance_before;
  q.inter_node_bytes = static_cast<double>(d.inter_node_bytes);
  q.remote_load_bytes = static_cast<double>(d.remote_load_bytes);
  if (partition_bound) {
    q.vit_pb = OverPartitionBound(d, true, per_image);
    q.llm_pb = OverPartitionBound(d, false, per_image);
  }
  // Image tokens per VL pack (sequence), over every VL sequence of the step.
  double sum = 0, sq = 0;
  const uint32_t packs = W * d.vl_seqs;
  for (uint32_t r = 0; r < W; ++r) {
    for (uint32_t k = d.text_seqs; k < S; ++k) {
      const uint32_t g = r * S + k;
      double img = 0;
      for (uint32_t j = d.docs.begin[g]; j < d.docs.begin[g + 1]; ++j) {
        img += d.samples[d.docs.items[j]].cost.image_tokens;
      }
      sum += img;
      sq += img * img;
    }
  }
  q.img_mean = packs ? sum / packs : 0;
  q.img_std = packs ? std::sqrt(std::max(0.0, sq / packs - q.img_mean * q.img_mean)) : 0;
  return q;
}

// Every cell of one (world size, stage) group averaged over the steps that
// all of its strategies planned: the same steps for everyone.
void AverageOverCommonSteps(std::vector<Cell>::iterator begin, std::vector<Cell>::iterator end) {
  size_t steps = 0;
  for (auto c = begin; c != end; ++c) steps = std::max(steps, c->per_step.size());
  std::vector<bool> common(steps, true);
  for (auto c = begin; c != end; ++c) {
    for (size_t s = 0; s < steps; ++s) {
      common[s] = common[s] && s < c->per_step.size() && c->per_step[s].has_value();
    }
  }
  for (auto c = begin; c != end; ++c) {
    StepQuality m;
    uint32_t n = 0;
    for (size_t s = 0; s < steps; ++s) {
      if (!common[s]) continue;
      const StepQuality& q = *c->per_step[s];
      m.vit += q.vit, m.vit_lb += q.vit_lb, m.llm += q.llm, m.llm_lb += q.llm_lb;
      m.tokens += q.tokens, m.img_std += q.img_std, m.img_mean += q.img_mean;
      m.vit_drawn += q.vit_drawn, m.llm_drawn += q.llm_drawn;
      m.vit_pb += q.vit_pb, m.llm_pb += q.llm_pb;
      m.inter_node_bytes += q.inter_node_bytes, m.remote_load_bytes += q.remote_load_bytes;
      ++n;
    }
    if (n > 0) {
      for (double* v :
           {&m.vit, &m.vit_lb, &m.llm, &m.llm_lb, &m.tokens, &m.img_std, &m.img_mean, &m.vit_drawn,
            &m.llm_drawn, &m.vit_pb, &m.llm_pb, &m.inter_node_bytes, &m.remote_load_bytes}) {
        *v /= n;
      }
    }
    c->mean = m;
    c->steps = n;
  }
}

std::string Label(const Cell& c);

// With --hashes DIR: the cell's job config (DIR/<cell>.textproto) and the
// identity hash of every step it planned (DIR/<cell>.hashes, as `tutti plan
// --format hash` prints them), so that the plans can be compared with what
// `tutti plan` and tutti-packerd compute for the same config and index.
std::string CellName(const Cell& c) {
  std::string name = absl::StrCat("W", c.ranks, "-px", c.max_pixels, "-", Label(c));
  for (char& ch : name) {
    if (ch == ' ' || ch == '=') ch = '_';
  }
  return name;
}

// `index_path`: the index file the written configs name (with --hashes).
void RunCell(const packer::SeedWorkloadOptions& wo, std::shared_ptr<const packer::Index> index,
             uint64_t steps, uint64_t build_steps, bool post, bool partition_bound,
             const std::string& hash_dir, const std::string& index_path, uint64_t resume_step,
             Cell* c) {
  v1::JobConfig config = packer::SeedConfig(wo, c->shape, c->ranks, c->max_pixels, c->strategy,
                                            std::max<uint32_t>(1, c->bins), post);
  // The job a daemon would load from the written config: index_path is part
  // of the job's identity.
  if (!hash_dir.empty()) config.set_index_path(index_path);
  if (!c->mixture.empty() &&
      !google::protobuf::TextFormat::ParseFromString(c->mixture, config.mutable_mixture())) {
    c->error = "the benchmark's mixture does not parse";
    return;
  }
  if (c->tolerance >= 0) config.mutable_post_balancing()->set_balance_tolerance(c->tolerance);
  // With post-balancing a peer re-deals each phase with its own balancer
  // (not job configuration: no hashes are written for it).
  packer::JobOptions options;
  const bool peer = post && c->strategy != "tutti";
  if (peer) options.post_balancing_peer = c->strategy;
  auto job = packer::Job::Create(config, index, options);
  if (!job.ok()) {
    c->error = std::string(job.status().message());
    return;
  }
  packer::Planner planner(*job);
  packer::StepPlanData d;
  v1::StepPlan plan;
  std::string hashes;
  (void)planner.Plan(steps, &d);  // warm-up (buffers), not measured
  if (resume_step > 0) {
    // A fresh packer's first plan far into the run (a resumed job).
    packer::Planner fresh(*job);
    const double t0 = ThreadCpuMs();
    absl::Status st = fresh.Plan(resume_step, &d);
    c->resume_ms = st.ok() ? ThreadCpuMs() - t0 : -1;
  }
  for (uint64_t s = 0; s < steps; ++s) {
    const double t0 = ThreadCpuMs();
    absl::Status st = planner.Plan(s, &d);
    const double ms = ThreadCpuMs() - t0;
    c->per_step.emplace_back();
    if (!st.ok()) {
      ++c->failed;
      if (c->error.empty()) c->error = std::string(st.message());
      continue;
    }
    c->plan_ms.push_back(ms);
    c->per_step.back() = Measure(d, partition_bound, post);
    if (s < build_steps || (!hash_dir.empty() && !peer)) {
      const double t1 = ThreadCpuMs();
      (void)packer::BuildStepPlan(**job, d, {}, &plan);
      if (s < build_steps) c->build_ms.push_back(ThreadCpuMs() - t1);
      if (!hash_dir.empty() && !peer)
        absl::StrAppend(&hashes, "step ", s, " ", packer::PlanHash(&plan), "\n");
    }
  }
  if (!hash_dir.empty() && !peer) {
    std::string text;
    google::protobuf::TextFormat::PrintToString((*job)->config(), &text);
    const std::string base = absl::StrCat(hash_dir, "/", CellName(*c));
    for (const auto& [path, bytes] :
         {std::pair{base + ".textproto", text}, std::pair{base + ".hashes", hashes}}) {
      if (absl::Status w = WriteFileAtomically(path, bytes); !w.ok() && c->error.empty()) {
        c->error = std::string(w.message());
      }
    }
  }
}

std::string Label(const Cell& c) {
  std::string name = c.strategy == "seed-v1" || c.strategy == "seed-v2"
                         ? absl::StrCat(c.strategy, " N=", c.bins)
                         : c.strategy;
  if (c.tolerance >= 0) name = absl::StrCat(c.strategy, " t=", c.tolerance);
  return c.sources > 0 ? absl::StrCat(name, " ", c.sources, "src") : name;
}

// Allowed excess of tutti over a peer, relative to the bound: tutti's local
// searches stop within 0.01% of the lower bound.
constexpr double kPeerSlack = 1e-4;

// With post-balancing, each tutti row of one (world size, stage) group
// against the peers of the group step by step: the steps in which its
// slowest rank is slower than the best peer's (over the bound, beyond
// kPeerSlack) in each phase, and its inter-node bytes against the fewest of
// any peer whose balance it matches.
void PrintPeerComparison(std::vector<Cell>::const_iterator begin,
                         std::vector<Cell>::const_iterator end) {
  for (auto t = begin; t != end; ++t) {
    if (t->strategy != "tutti") continue;
    uint32_t steps = 0, behind[2] = {0, 0};
    std::string worst[2];  // the step where tutti trails the most, per phase
    double worst_by[2] = {0, 0};
    for (size_t s = 0; s < t->per_step.size(); ++s) {
      if (!t->per_step[s]) continue;
      double best[2] = {1e300, 1e300};
      std::string who[2];
      for (auto p = begin; p != end; ++p) {
        if (p->strategy == "tutti" || p->strategy == "sequential") continue;
        if (s >= p->per_step.size() || !p->per_step[s]) continue;
        const double f[2] = {p->per_step[s]->vit_lb, p->per_step[s]->llm_lb};
        for (int k = 0; k < 2; ++k) {
          if (f[k] < best[k]) best[k] = f[k], who[k] = p->strategy;
        }
      }
      if (best[0] == 1e300) continue;
      ++steps;
      const double own[2] = {t->per_step[s]->vit_lb, t->per_step[s]->llm_lb};
      for (int k = 0; k < 2; ++k) {
        const double by = own[k] - best[k];
        if (by <= kPeerSlack) continue;
        ++behind[k];
        if (by > worst_by[k]) {
          worst_by[k] = by;
          worst[k] =
              absl::StrFormat(" (step %zu: %.5f against %s's %.5f)", s, own[k], who[k], best[k]);
        }
      }
    }
    if (steps == 0) continue;
    double fewest = -1;
    for (auto p = begin; p != end; ++p) {
      if (p->strategy == "tutti" || p->strategy == "sequential" || p->steps == 0) continue;
      const double b = p->mean.inter_node_bytes + p->mean.remote_load_bytes;
      if (fewest < 0 || b < fewest) fewest = b;
    }
    const double own = t->mean.inter_node_bytes + t->mean.remote_load_bytes;
    std::printf(
        "  %s against the best peer of each step: ViT behind in %u of %u steps%s, LLM in %u%s; "
        "inter-node bytes %.3gx the fewest of a peer's\n",
        Label(*t).c_str(), behind[0], steps, worst[0].c_str(), behind[1], worst[1].c_str(),
        fewest > 0 ? own / fewest : 0.0);
  }
}

// `bounds`: with the columns over the partition bound (--partition-bound);
// `post`: with the bytes between nodes and the comparison with the peers.
void PrintTable(const std::vector<Cell>& cells, bool bounds, bool post) {
  uint32_t last_ranks = 0;
  uint64_t last_px = 0;
  size_t group = 0;
  for (size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    if (c.ranks != last_ranks || c.max_pixels != last_px) {
      if (post && i > 0) PrintPeerComparison(cells.begin() + group, cells.begin() + i);
      group = i;
      last_ranks = c.ranks;
      last_px = c.max_pixels;
      std::printf(
          "\nW=%u  max_pixels=%llu  seq_len=%u  per rank %u text + %u VL sequences  "
          "per step %u text + %u VL samples (mean %.0f / %.0f tokens)\n",
          c.ranks, static_cast<unsigned long long>(c.max_pixels), c.seq_len, c.shape.text_seqs,
          c.shape.vl_seqs, c.shape.text_samples, c.shape.vl_samples, c.shape.mean_text_tokens,
          c.shape.mean_vl_tokens);
      std::printf("  %-12s %8s %8s %8s %8s %8s %8s %8s ", "strategy", "plan_ms", "p99_ms",
                  "build_ms", "vit", "vit/lb", "llm", "llm/lb");
      if (bounds) std::printf("%8s %8s ", "vit/pb", "llm/pb");
      if (post) std::printf("%10s ", "xnode_MB");
      std::printf("%8s %9s %8s %6s\n", "tokens", "img_std", "vit_drw", "failed");
    }
    if (c.plan_ms.empty()) {
      std::printf("  %-12s  no step planned: %s\n", Label(c).c_str(), c.error.c_str());
      continue;
    }
    std::printf("  %-12s %8.2f %8.2f %8.1f %8.3f %8.3f %8.3f %8.3f ", Label(c).c_str(),
                Quantile(c.plan_ms, 0.5), Quantile(c.plan_ms, 0.99), Quantile(c.build_ms, 0.5),
                c.mean.vit, c.mean.vit_lb, c.mean.llm, c.mean.llm_lb);
    if (bounds) std::printf("%8.3f %8.3f ", c.mean.vit_pb, c.mean.llm_pb);
    if (post) std::printf("%10.1f ", (c.mean.inter_node_bytes + c.mean.remote_load_bytes) / 1e6);
    std::printf("%8.3f %9.0f %8.3f %6u\n", c.mean.tokens, c.mean.img_std, c.mean.vit_drawn,
                c.failed);
  }
  if (post && !cells.empty()) PrintPeerComparison(cells.begin() + group, cells.end());
}

std::string JsonEscape(const std::string& in) {
  std::string out;
  for (char ch : in) {
    if (ch == '"' || ch == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(ch) >= 0x20) out.push_back(ch);
  }
  return out;
}

void PrintJson(const std::vector<Cell>& cells, bool bounds) {
  std::printf("[\n");
  for (size_t i = 0; i < cells.size(); ++i) {
    const Cell& c = cells[i];
    std::printf(
        "  {\"strategy\": \"%s\", \"bins\": %u, \"ranks\": %u, \"max_pixels\": %llu, "
        "\"seq_len\": %u, "
        "\"text_seqs\": %u, \"vl_seqs\": %u, \"text_samples\": %u, \"vl_samples\": %u, "
        "\"steps\": %u, \"failed_steps\": %u, \"plan_ms_median\": %.4f, \"plan_ms_p99\": %.4f, "
        "\"build_ms_median\": %.3f, \"vit_imbalance\": %.5f, \"vit_imbalance_vs_lb\": %.5f, "
        "\"llm_imbalance\": %.5f, \"llm_imbalance_vs_lb\": %.5f, \"llm_tokens_imbalance\": %.5f, "
        "\"image_tokens_std\": %.2f, \"image_tokens_mean\": %.2f, \"vit_imbalance_drawn\": %.5f, "
        "\"llm_imbalance_drawn\": %.5f, \"inter_node_bytes\": %.0f, \"remote_load_bytes\": "
        "%.0f, \"sources\": %u, \"resume_plan_ms\": %.2f%s%s%s%s%s}%s\n",
        c.strategy.c_str(), c.bins, c.ranks, static_cast<unsigned long long>(c.max_pixels),
        c.seq_len, c.shape.text_seqs, c.shape.vl_seqs, c.shape.text_samples, c.shape.vl_samples,
        c.steps, c.failed, Quantile(c.plan_ms, 0.5), Quantile(c.plan_ms, 0.99),
        Quantile(c.build_ms, 0.5), c.mean.vit, c.mean.vit_lb, c.mean.llm, c.mean.llm_lb,
        c.mean.tokens, c.mean.img_std, c.mean.img_mean, c.mean.vit_drawn, c.mean.llm_drawn,
        c.mean.inter_node_bytes, c.mean.remote_load_bytes, c.sources, c.resume_ms,
        c.tolerance >= 0 ? absl::StrFormat(", \"balance_tolerance\": %g", c.tolerance).c_str() : "",
        bounds ? absl::StrFormat(", \"vit_imbalance_vs_partition_bound\": %.5f, "
                                 "\"llm_imbalance_vs_partition_bound\": %.5f",
                                 c.mean.vit_pb, c.mean.llm_pb)
                     .c_str()
               : "",
        c.error.empty() ? "" : ", \"error\": \"", JsonEscape(c.error).c_str(),
        c.error.empty() ? "" : "\"", i + 1 < cells.size() ? "," : "");
  }
  std::printf("]\n");
}

int IndexLoadBench(uint64_t samples, const std::string& dir, bool json) {
  packer::SyntheticOptions o;
  o.samples = samples;
  auto t0 = Clock::now();
  auto bytes = packer::MakeSyntheticIndex(o);
  if (!bytes.ok()) {
    std::fprintf(stderr, "tutti bench packer: %s\n", std::string(bytes.status().message()).c_str());
    return 1;
  }
  const double gen_s = Ms(t0) / 1e3;
  const std::string path = absl::StrCat(dir, "/tutti-bench-index-", samples, ".idx");
  if (absl::Status s = WriteFileAtomically(path, *bytes); !s.ok()) {
    std::fprintf(stderr, "tutti bench packer: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const size_t file_bytes = bytes->size();
  bytes->clear();
  bytes->shrink_to_fit();
  t0 = Clock::now();
  auto index = packer::LoadIndex(path);
  const double load_s = Ms(t0) / 1e3;
  std::remove(path.c_str());
  if (!index.ok()) {
    std::fprintf(stderr, "tutti bench packer: %s\n", std::string(index.status().message()).c_str());
    return 1;
  }
  const double per_sample = double((*index)->memory_bytes()) / samples;
  if (json) {
    std::printf(
        "{\"index_samples\": %llu, \"index_file_bytes\": %zu, \"index_load_seconds\": %.3f, "
        "\"index_memory_bytes_per_sample\": %.2f, \"index_generate_seconds\": %.2f}\n",
        static_cast<unsigned long long>(samples), file_bytes, load_s, per_sample, gen_s);
  } else {
    std::printf(
        "index of %llu samples: file %.1f MB, load + verify %.3f s, %.1f bytes/sample in "
        "memory (generated in %.1f s)\n",
        static_cast<unsigned long long>(samples), file_bytes / 1e6, load_s, per_sample, gen_s);
  }
  return 0;
}

// --seed-stream: the seed's heuristics over a continuous stream (seed_stream.h):
// the steps' samples, text and VL interleaved in proportion, through N open
// bins carried across steps; the image-token spread over the stream's packs.
// Beside it the same rule on the VL samples alone (what the per-step
// strategies pack into VL sequences).
int SeedStreamBench(const packer::SeedWorkloadOptions& wo,
                    std::shared_ptr<const packer::Index> index, uint32_t ranks,
                    const std::vector<uint64_t>& stages, uint64_t steps, bool json) {
  if (json) std::printf("[\n");
  bool first = true;
  for (uint64_t px : stages) {
    auto shape = packer::SeedShape(wo, *index, ranks, px);
    if (!shape.ok()) {
      std::fprintf(stderr, "tutti bench packer: %s\n",
                   std::string(shape.status().message()).c_str());
      return 1;
    }
    auto job =
        packer::Job::Create(packer::SeedConfig(wo, *shape, ranks, px, "greedy", 1, false), index);
    if (!job.ok()) {
      std::fprintf(stderr, "tutti bench packer: %s\n", std::string(job.status().message()).c_str());
      return 1;
    }
    packer::Planner planner(*job);
    packer::StepPlanData d;
    std::vector<packer::PackItem> mixed, vl_only;
    uint32_t seq_len = 0;
    for (uint64_t s = 0; s < steps; ++s) {
      if (absl::Status st = planner.Draw(s, &d); !st.ok()) {
        std::fprintf(stderr, "tutti bench packer: %s\n", std::string(st.message()).c_str());
        return 1;
      }
      seq_len = d.seq_len;
      // Text sample k at (k + 1/2) / T of the step, VL sample j at (j + 1/2) / V.
      const size_t T = d.text_items.size(), V = d.vl_items.size();
      for (size_t k = 0, j = 0; k < T || j < V;) {
        const bool text = j == V || (k < T && (2 * k + 1) * V <= (2 * j + 1) * T);
        mixed.push_back(text ? d.text_items[k++] : d.vl_items[j++]);
      }
      vl_only.insert(vl_only.end(), d.vl_items.begin(), d.vl_items.end());
    }
    const uint32_t img_cap = (*job)->config().batch().img_cap_tokens();
    if (!json) {
      std::printf(
          "\nmax_pixels=%llu seq_len=%u img_cap=%u: %llu steps of %u text + %u VL samples, one "
          "stream (%zu samples, %zu VL)\n  %-12s %8s %10s %10s %10s %10s   %8s %10s %10s\n",
          static_cast<unsigned long long>(px), seq_len, img_cap,
          static_cast<unsigned long long>(steps), shape->text_samples, shape->vl_samples,
          mixed.size(), vl_only.size(), "strategy", "packs", "img_mean", "img_std", "vit_std",
          "fill", "vl_packs", "vl_img_std", "vl_fill");
    }
    for (const bool v2 : {false, true}) {
      for (const uint32_t n : {1u, 2u, 4u, 6u, 8u}) {
        packer::PackSpread spread[2];
        for (int which = 0; which < 2; ++which) {
          packer::SeedStreamPacker packer({n, v2, seq_len, img_cap});
          std::vector<packer::StreamPack> packs;
          for (const packer::PackItem& it : which == 0 ? mixed : vl_only) {
            if (absl::Status st = packer.Add(it, &packs); !st.ok()) {
              std::fprintf(stderr, "tutti bench packer: %s\n", std::string(st.message()).c_str());
              return 1;
            }
          }
          packer.Flush(&packs);
          spread[which] = packer::MeasurePacks(packs);
        }
        const char* name = v2 ? "seed-v2" : "seed-v1";
        if (json) {
          std::printf(
              "%s  {\"strategy\": \"%s\", \"bins\": %u, \"max_pixels\": %llu, \"steps\": %llu, "
              "\"packs\": %llu, \"image_tokens_mean\": %.2f, \"image_tokens_std\": %.2f, "
              "\"vit_std\": %.2f, \"fill\": %.4f, \"vl_packs\": %llu, \"vl_image_tokens_std\": "
              "%.2f, \"vl_fill\": %.4f}",
              first ? "" : ",\n", name, n, static_cast<unsigned long long>(px),
              static_cast<unsigned long long>(steps),
              static_cast<unsigned long long>(spread[0].packs), spread[0].image_tokens_mean,
              spread[0].image_tokens_std, spread[0].vit_std, spread[0].tokens_mean / seq_len,
              static_cast<unsigned long long>(spread[1].packs), spread[1].image_tokens_std,
              spread[1].tokens_mean / seq_len);
          first = false;
        } else {
          std::printf("  %-12s %8llu %10.0f %10.0f %10.0f %10.3f   %8llu %10.0f %10.3f\n",
                      absl::StrCat(name, " N=", n).c_str(),
                      static_cast<unsigned long long>(spread[0].packs), spread[0].image_tokens_mean,
                      spread[0].image_tokens_std, spread[0].vit_std,
                      spread[0].tokens_mean / seq_len,
                      static_cast<unsigned long long>(spread[1].packs), spread[1].image_tokens_std,
                      spread[1].tokens_mean / seq_len);
        }
      }
    }
  }
  if (json) std::printf("\n]\n");
  return 0;
}

int RunBenchPacker(int argc, char** argv) {
  std::string ranks_text = "8,64,512,2560", stages_text = "1003520,16777216", only;
  uint64_t steps = 20, build_steps = 3, samples = 0, index_samples = 0, resume_step = 0;
  uint32_t sources = 0;
  bool json = false, post = false, seed_stream = false, partition_bound = false;
  std::string tmp_dir = "/tmp", hash_dir, index_path, seq_lens_text, tolerances_text;
  packer::SeedWorkloadOptions wo;
  Cli cli("tutti bench packer [options]",
          "Runs every packing strategy on the seed's workload (seq_len 32,768; 4 sequences per\n"
          "rank; 80% text-only samples with lognormal lengths (median 1,000 tokens), 20% VL with\n"
          "1-4 images, 90% up to 2 MP and 10% up to 16 MP; curriculum stages 1 MP and 16 MP;\n"
          "8 ranks per node) and prints, per strategy, world size and stage: planning-core time\n"
          "per step (median, p99; one core), StepPlan build time for all ranks, ViT-cost and\n"
          "LLM-cost imbalance (max/mean across ranks) and each as a ratio to the lower bound\n"
          "max(mean, largest single item), LLM-token imbalance, the std-dev of image tokens per\n"
          "VL pack, and the drawn (unbalanced) ViT imbalance. Seed strategies run with N = 1, 2,\n"
          "4, 6, 8 open bins; the peers lpt, kk, multipack and sequential beside them. Quality\n"
          "numbers are averaged over the steps every strategy of the (world size, stage) planned\n"
          "(`steps`), and `failed` counts the steps each could not plan. --index-samples N\n"
          "measures loading an N-sample index instead.");
  cli.Flag("ranks", &ranks_text, "comma-separated world sizes");
  cli.Flag("stages", &stages_text, "comma-separated max_pixels of the curriculum stages");
  cli.Flag("seq-lens", &seq_lens_text,
           "comma-separated seq_len of each stage (one per --stages; empty: 32768 for all)");
  cli.Flag("index", &index_path,
           "plan on this index (`tutti index` of a real dataset, e.g. from `tutti gen-dataset`) "
           "instead of the synthetic seed workload; --samples and --seed's dataset are unused");
  cli.Flag("steps", &steps, "steps planned per cell");
  cli.Flag("build-steps", &build_steps, "steps per cell whose full StepPlan is built and timed");
  cli.Flag("fill", &wo.fill, "target fill of every sequence");
  cli.Flag("strategies", &only,
           "comma-separated subset (greedy,seed-v1,seed-v2,tutti,lpt,kk,multipack,sequential); "
           "empty: all");
  cli.Flag("post-balancing", &post,
           "plan with batch post-balancing: tutti's node-aware re-deal, and each peer (lpt, kk, "
           "multipack, sequential) re-dealing each phase with its own balancer, node-oblivious; "
           "adds the bytes between nodes per step (xnode_MB: forward and load exchange) and, per "
           "world size and stage, the steps in which tutti is behind the best peer on each phase "
           "(greedy and the seed strategies do not run; see also tutti bench exchange)");
  cli.Flag("tolerances", &tolerances_text,
           "with --post-balancing: comma-separated post_balancing.balance_tolerance values, each "
           "a tutti row (\"tutti t=...\") beside the default one: balance against inter-node "
           "bytes");
  cli.Flag("partition-bound", &partition_bound,
           "also report each phase's slowest rank over the partition bound, the largest "
           "makespan bin-packing bounds prove impossible for the step's items "
           "(services/packer/core/partition_bound.h; columns vit/pb, llm/pb; about 15 s a "
           "step at W = 2560)");
  cli.Flag("samples", &samples, "synthetic dataset size (0: enough for the largest world)");
  cli.Flag("seed", &wo.seed, "seed of the synthetic dataset and the jobs");
  cli.Flag("json", &json, "print a JSON array (one object per strategy, world size and stage)");
  cli.Flag("index-samples", &index_samples,
           "measure writing+loading a synthetic index of this many samples (e.g. 10000000)");
  cli.Flag("tmp", &tmp_dir, "directory for the index-load measurement's file");
  cli.Flag("seed-stream", &seed_stream,
           "run seed-v1/v2 (N = 1, 2, 4, 6, 8) over one continuous stream of the steps' samples "
           "(bins carried across steps, text and VL in the same bins) at the first --ranks' "
           "step size, and print the image-token spread over the stream's packs");
  cli.Flag("sources", &sources,
           "also plan every cell as a mixture of this many sources, side by side with the two "
           "streams: the dataset's samples re-sharded into FineVision's shape (every fourth "
           "source text-only, the others VL, sizes over three orders of magnitude), weighted "
           "by their sizes (services/packer/README.md, \"Mixtures\")");
  cli.Flag("resume-step", &resume_step,
           "also time a fresh planner's first plan of this step (a job resumed there) per cell");
  cli.Flag("hashes", &hash_dir,
           "write the dataset (DIR/index.idx), each cell's job config (DIR/<cell>.textproto) and "
           "the identity hash of every planned step (DIR/<cell>.hashes) to this directory");
  int rc = 0;
  if (!cli.Parse(argc, argv, &rc)) return rc;
  if (index_samples > 0) return IndexLoadBench(index_samples, tmp_dir, json);

  std::vector<uint32_t> ranks;
  std::vector<uint64_t> stages;
  for (absl::string_view p : absl::StrSplit(ranks_text, ',', absl::SkipEmpty())) {
    uint32_t v = 0;
    if (!absl::SimpleAtoi(p, &v) || v == 0) {
      std::fprintf(stderr, "tutti bench packer: --ranks '%s' is not a list like 8,64\n",
                   ranks_text.c_str());
      return 2;
    }
    ranks.push_back(v);
  }
  for (absl::string_view p : absl::StrSplit(stages_text, ',', absl::SkipEmpty())) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi(p, &v) || v < 784) {
      std::fprintf(stderr, "tutti bench packer: --stages '%s' is not a list of max_pixels\n",
                   stages_text.c_str());
      return 2;
    }
    stages.push_back(v);
  }
  std::vector<uint32_t> seq_lens(stages.size(), wo.seq_len);
  if (!seq_lens_text.empty()) {
    seq_lens.clear();
    for (absl::string_view p : absl::StrSplit(seq_lens_text, ',', absl::SkipEmpty())) {
      uint32_t v = 0;
      if (!absl::SimpleAtoi(p, &v) || v == 0) v = 0, seq_lens.clear();
      if (v == 0) break;
      seq_lens.push_back(v);
    }
    if (seq_lens.size() != stages.size()) {
      std::fprintf(stderr,
                   "tutti bench packer: --seq-lens '%s' is not one seq_len per --stages entry\n",
                   seq_lens_text.c_str());
      return 2;
    }
  }
  struct Strategy {
    std::string name;
    uint32_t bins;
  };
  std::vector<Strategy> strategies;
  auto wanted = [&](const std::string& n) {
    return only.empty() ||
           absl::StrContains(absl::StrCat(",", only, ","), absl::StrCat(",", n, ","));
  };
  if (wanted("greedy")) strategies.push_back({"greedy", 1});
  for (const char* seed : {"seed-v1", "seed-v2"}) {
    if (!wanted(seed)) continue;
    for (uint32_t n : {1u, 2u, 4u, 6u, 8u}) strategies.push_back({seed, n});
  }
  for (const char* name : {"tutti", "lpt", "kk", "multipack", "sequential"}) {
    if (wanted(name)) strategies.push_back({name, 0});
  }
  std::vector<double> tolerances;
  for (absl::string_view p : absl::StrSplit(tolerances_text, ',', absl::SkipEmpty())) {
    double v = 0;
    if (!absl::SimpleAtod(p, &v) || !(v >= 0)) {
      std::fprintf(stderr, "tutti bench packer: --tolerances '%s' is not a list like 0,0.001\n",
                   tolerances_text.c_str());
      return 2;
    }
    tolerances.push_back(v);
  }
  if (post) {
    // A post-balancing re-deal is tutti's or a peer's; the seed strategies
    // pack bins in order and have no re-deal.
    std::vector<Strategy> kept;
    for (const Strategy& s : strategies) {
      if (s.name != "greedy" && s.name != "seed-v1" && s.name != "seed-v2") kept.push_back(s);
    }
    strategies = std::move(kept);
  } else if (!tolerances.empty()) {
    std::fprintf(stderr, "tutti bench packer: --tolerances needs --post-balancing\n");
    return 2;
  }

  const uint32_t max_w = *std::max_element(ranks.begin(), ranks.end());
  if (samples == 0) {
    // Every stream holds at least two steps of the largest world (exactly-once
    // sampling needs them; VL samples are smallest at low max_pixels), and
    // never fewer than 50k.
    samples = std::max<uint64_t>(50000, uint64_t{max_w} * wo.seqs_per_rank * wo.seq_len / 1400 * 6);
  }
  auto t0 = Clock::now();
  absl::StatusOr<std::shared_ptr<const packer::Index>> index;
  const bool real_index = !index_path.empty();
  if (real_index) {
    index = packer::LoadIndex(index_path);
  } else {
    auto index_bytes = packer::MakeSeedIndexBytes(wo, samples);
    index = index_bytes.ok()
                ? packer::Index::FromString(*index_bytes, "seed-workload")
                : absl::StatusOr<std::shared_ptr<const packer::Index>>(index_bytes.status());
    if (index.ok() && !hash_dir.empty()) {
      if (absl::Status w = WriteFileAtomically(hash_dir + "/index.idx", *index_bytes); !w.ok()) {
        index = w;
      }
    }
    index_path = hash_dir + "/index.idx";
  }
  if (!index.ok()) {
    std::fprintf(stderr, "tutti bench packer: %s\n", std::string(index.status().message()).c_str());
    return 1;
  }
  // With --sources: the same samples in sources, for both kinds of cell.
  std::string mixture_text;
  if (sources > 0) {
    std::vector<packer::MixtureDatasetSource> list;
    auto bytes = packer::ReshardIntoSources(**index, sources / 4, sources - sources / 4, 100,
                                            wo.seed, &list);
    if (bytes.ok()) {
      index = packer::Index::FromString(*bytes, absl::StrCat(sources, "-sources"));
      if (index.ok() && !hash_dir.empty()) {
        if (absl::Status w = WriteFileAtomically(hash_dir + "/index.idx", *bytes); !w.ok()) {
          index = w;
        }
      }
    } else {
      index = bytes.status();
    }
    if (!index.ok()) {
      std::fprintf(stderr, "tutti bench packer: %s\n",
                   std::string(index.status().message()).c_str());
      return 1;
    }
    packer::MixtureDatasetOptions shape;
    shape.sources = list;
    mixture_text = packer::MixtureConfigText(shape, /*by_size=*/true);
    mixture_text = mixture_text.substr(mixture_text.find('{') + 1);
    mixture_text = mixture_text.substr(0, mixture_text.rfind('}'));
  }
  const uint64_t dataset_samples = (*index)->num_samples();
  std::fprintf(stderr, "dataset: %llu %s samples (%zu VL) in %.1f s\n",
               static_cast<unsigned long long>(dataset_samples),
               real_index ? "indexed" : "synthetic", (*index)->vl_samples().size(), Ms(t0) / 1e3);
  if (seed_stream) return SeedStreamBench(wo, *index, ranks[0], stages, steps, json);
  std::vector<Cell> cells;
  for (uint32_t w : ranks) {
    for (size_t k = 0; k < stages.size(); ++k) {
      const uint64_t px = stages[k];
      packer::SeedWorkloadOptions so = wo;
      so.seq_len = seq_lens[k];
      auto shape = packer::SeedShape(so, **index, w, px);
      if (!shape.ok()) {
        std::fprintf(stderr, "tutti bench packer: %s\n",
                     std::string(shape.status().message()).c_str());
        return 1;
      }
      const size_t group = cells.size();
      std::vector<std::pair<Strategy, double>> runs;
      for (const Strategy& s : strategies) {
        runs.push_back({s, -1});
        if (s.name == "tutti") {
          for (double t : tolerances) runs.push_back({s, t});
        }
      }
      for (const auto& [s, tolerance] : runs) {
        for (const bool mixed : {false, true}) {
          if (mixed && sources == 0) continue;
          Cell c;
          c.strategy = s.name;
          c.bins = s.bins;
          c.tolerance = tolerance;
          c.ranks = w;
          c.max_pixels = px;
          c.seq_len = so.seq_len;
          c.shape = *shape;
          if (mixed) {
            c.mixture = mixture_text;
            c.sources = sources;
          }
          const auto tc = Clock::now();
          RunCell(so, *index, steps, build_steps, post, partition_bound, hash_dir, index_path,
                  resume_step, &c);
          std::fprintf(stderr,
                       "  W=%u max_pixels=%llu %-12s %zu steps planned, %u failed in %.1f s\n", w,
                       static_cast<unsigned long long>(px), Label(c).c_str(), c.plan_ms.size(),
                       c.failed, Ms(tc) / 1e3);
          cells.push_back(std::move(c));
        }
      }
      AverageOverCommonSteps(cells.begin() + group, cells.end());
    }
  }
  if (json) {
    PrintJson(cells, partition_bound);
  } else {
    std::printf("packer benchmark, %s, fill %.2f, %llu steps per cell%s\n",
                real_index ? absl::StrCat("index ", index_path).c_str() : "seed workload", wo.fill,
                static_cast<unsigned long long>(steps), post ? ", post-balancing" : "");
    std::printf(
        "columns: plan/p99 = planning-core CPU ms per step (one thread); build = StepPlan for "
        "all ranks (CPU ms);\n  vit, llm = max/mean cost across ranks; /lb = max over "
        "max(mean, largest item); /pb (with --partition-bound) = max over the\n  partition bound; "
        "tokens = LLM-token max/mean;\n  img_std = std-dev of "
        "image tokens per VL pack; vit_drw = ViT max/mean of the drawn split;\n  averaged over "
        "the steps every strategy planned; failed = steps this strategy could not plan\n");
    PrintTable(cells, partition_bound, post);
    if (resume_step > 0) {
      std::printf("\na fresh planner's first plan of step %llu (a job resumed there), CPU ms:\n",
                  static_cast<unsigned long long>(resume_step));
      for (const Cell& c : cells) {
        std::printf("  W=%u max_pixels=%llu %-14s %10.1f\n", c.ranks,
                    static_cast<unsigned long long>(c.max_pixels), Label(c).c_str(), c.resume_ms);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tutti::tools

TUTTI_COMMAND("bench packer", "compare every packing strategy on the seed workload",
              tutti::tools::RunBenchPacker);

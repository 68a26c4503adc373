#include "services/packer/core/mixture.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/status.h"

namespace tutti::packer {
namespace {

constexpr uint32_t kRampStairs = 16;

const char* StreamName(bool vl) { return vl ? "VL" : "text-only"; }
const char* PerStepField(bool vl) { return vl ? "vl_samples_per_step" : "text_samples_per_step"; }

LongDocuments ParseLongDocuments(const std::string& s, LongDocuments fallback) {
  if (s == "split") return LongDocuments::kSplit;
  if (s == "truncate") return LongDocuments::kTruncate;
  if (s == "skip") return LongDocuments::kSkip;
  return fallback;
}

std::string Digest(const std::string& bytes) {
  const uint32_t a = Crc32c(bytes);
  const uint32_t b = Crc32cExtend(0x9E3779B9u, bytes.data(), bytes.size());
  return absl::StrCat(absl::Hex(a, absl::kZeroPad8), absl::Hex(b, absl::kZeroPad8));
}

// A source part's blocks: the steps' draws of one slot of a stream. The
// sampler asks for the block at each source-epoch's first position; the
// answers are kept (a few hundred a source), since every step's samplers
// are new.
class SlotBlocks : public StepBlocks {
 public:
  SlotBlocks(const Apportionment* a, uint32_t slot) : a_(a), slot_(slot) {}
  void BlockOf(uint64_t p, uint64_t* start, uint64_t* length) const override {
    {
      absl::MutexLock lock(&mu_);
      auto it = known_.find(p);
      if (it != known_.end()) {
        *start = it->second.first;
        *length = it->second.second;
        return;
      }
    }
    const uint64_t step = a_->StepOf(slot_, p);
    thread_local std::vector<uint32_t> count;
    thread_local std::vector<uint64_t> before;
    count.resize(a_->sources());
    before.resize(a_->sources());
    a_->At(step, count.data(), before.data());
    *start = before[slot_];
    *length = count[slot_];
    absl::MutexLock lock(&mu_);
    if (known_.size() >= kKept) known_.erase(known_.begin());
    known_.emplace(p, std::make_pair(*start, *length));
  }

 private:
  static constexpr size_t kKept = 256;
  const Apportionment* a_;
  uint32_t slot_;
  mutable absl::Mutex mu_;
  mutable std::map<uint64_t, std::pair<uint64_t, uint64_t>> known_ ABSL_GUARDED_BY(mu_);
};

std::atomic<uint64_t> next_mixture_id{1};

}  // namespace

uint64_t NameKey(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

uint32_t SourcePart::ListIndex(uint64_t i) const {
  if (ranges.size() == 1) return ranges[0].first + static_cast<uint32_t>(i);
  const size_t r =
      static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), i) - offsets.begin()) -
      1;
  return ranges[r].first + static_cast<uint32_t>(i - offsets[r]);
}

absl::StatusOr<std::unique_ptr<const Mixture>> Mixture::Create(
    const v1::JobConfig& config, const Index& index, const absl::Span<const uint32_t> streams[2],
    const uint32_t per_step[2], LongDocuments job_long_documents) {
  std::unique_ptr<Mixture> m(new Mixture());
  m->seed_ = config.seed();
  m->id_ = next_mixture_id.fetch_add(1);
  m->per_step_[0] = per_step[0];
  m->per_step_[1] = per_step[1];
  m->streams_[0] = streams[0];
  m->streams_[1] = streams[1];
  const v1::MixtureConfig& mc = config.mixture();
  m->sources_.resize(mc.sources_size());
  for (int i = 0; i < mc.sources_size(); ++i) {
    MixtureSource& s = m->sources_[i];
    s.name = mc.sources(i).name();
    s.max_pixels = mc.sources(i).max_pixels();
    s.long_documents = ParseLongDocuments(mc.sources(i).long_documents(), job_long_documents);
  }
  RETURN_IF_ERROR(m->Resolve(config, index, streams));
  m->BuildSegments(config);
  RETURN_IF_ERROR(m->BuildStreams(config, streams, per_step));
  m->BuildHistory(config);
  return std::unique_ptr<const Mixture>(std::move(m));
}

absl::Status Mixture::Resolve(const v1::JobConfig& config, const Index& index,
                              const absl::Span<const uint32_t> streams[2]) {
  const v1::MixtureConfig& mc = config.mixture();
  // Which shards each index file gave the (possibly combined) index.
  struct Part {
    uint32_t first = 0, count = 0;
    std::string prefix;
  };
  std::map<std::string, Part> files;
  for (const auto& [key, value] : index.meta()) {
    if (key != kCombinedIndexMeta) continue;
    std::vector<std::string> f = absl::StrSplit(value, '\t');
    Part p;
    if (f.size() != 4 || !absl::SimpleAtoi(f[1], &p.first) || !absl::SimpleAtoi(f[2], &p.count)) {
      continue;
    }
    p.prefix = f[3];
    files[f[0]] = p;
  }
  std::vector<int> owner(index.num_shards(), -1);
  for (int i = 0; i < mc.sources_size(); ++i) {
    const v1::MixtureSource& cs = mc.sources(i);
    MixtureSource& s = sources_[i];
    const std::string at = absl::StrCat("mixture.sources[", i, "] ('", cs.name(), "')");
    const std::string& path = cs.index_path().empty() ? config.index_path() : cs.index_path();
    Part file{0, index.num_shards(), ""};
    if (!files.empty()) {
      auto it = files.find(path);
      if (it == files.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat(at, " names index ", path, ", which the job did not load"));
      }
      file = it->second;
    }
    uint64_t selected = 0;
    for (uint32_t sh = file.first; sh < file.first + file.count; ++sh) {
      const std::string& name = index.shard(sh).name;
      absl::string_view own(name);
      if (absl::StartsWith(own, file.prefix)) own.remove_prefix(file.prefix.size());
      bool take = cs.shard_prefixes_size() == 0;
      for (const std::string& p : cs.shard_prefixes()) take |= absl::StartsWith(own, p);
      if (!take) continue;
      if (owner[sh] >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, " and mixture.sources[", owner[sh], "] ('", mc.sources(owner[sh]).name(),
            "') both name shard ", name,
            ": a shard belongs to one source; narrow their shard_prefixes (e.g. 'ocr/' and "
            "'charts/') or index_path so that they select different shards"));
      }
      owner[sh] = i;
      ++selected;
      if (!s.shards.empty() && s.shards.back().second == sh) {
        ++s.shards.back().second;
      } else {
        s.shards.emplace_back(sh, sh + 1);
      }
    }
    if (selected == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          at, " selects no shard of index ", path,
          cs.shard_prefixes_size() > 0
              ? absl::StrCat(": no shard name starts with ",
                             absl::StrJoin(cs.shard_prefixes(), " or "),
                             "; fix its shard_prefixes (names are relative to the index's source "
                             "directory, e.g. 'ocr/')")
              : ": the index has no shards; index the dataset again"));
    }
    // Its samples in each stream: the stream lists' entries in its shards.
    for (const int vl : {0, 1}) {
      const v1::Modality want = vl ? v1::MODALITY_VL : v1::MODALITY_TEXT;
      if (cs.modality() != v1::MODALITY_UNSPECIFIED && cs.modality() != want) continue;
      SourcePart& part = s.part[vl];
      const absl::Span<const uint32_t> list = streams[vl];
      for (const auto& [first, end] : s.shards) {
        const uint32_t lo_id = index.shard(first).first_sample;
        const IndexShard& last = index.shard(end - 1);
        const uint32_t hi_id = last.first_sample + last.num_samples;
        const uint32_t lo =
            static_cast<uint32_t>(std::lower_bound(list.begin(), list.end(), lo_id) - list.begin());
        const uint32_t hi =
            static_cast<uint32_t>(std::lower_bound(list.begin(), list.end(), hi_id) - list.begin());
        if (hi == lo) continue;
        part.offsets.push_back(part.n);
        part.ranges.emplace_back(lo, hi);
        part.n += hi - lo;
      }
      const uint64_t cap = cs.max_samples_per_epoch();
      part.epoch_size = cap > 0 ? std::min(cap, part.n) : part.n;
      part.key = NameKey(cs.name()) ^ (vl ? 0x564C564C564C564Cull : 0x5445585454455854ull);
    }
    if (s.part[0].n == 0 && s.part[1].n == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          at, " has no samples the stager can serve in its ", selected, " shards",
          cs.modality() == v1::MODALITY_TEXT ? " that are text-only"
          : cs.modality() == v1::MODALITY_VL ? " that are vision-language"
                                             : "",
          "; point it at shards that hold such samples",
          cs.modality() != v1::MODALITY_UNSPECIFIED ? ", or leave its modality unset" : "",
          ", or remove the source"));
    }
  }
  return absl::OkStatus();
}

void Mixture::BuildSegments(const v1::JobConfig& config) {
  const v1::MixtureConfig& mc = config.mixture();
  std::map<std::string, int> by_name;
  std::vector<double> w(mc.sources_size());
  for (int i = 0; i < mc.sources_size(); ++i) {
    by_name[mc.sources(i).name()] = i;
    w[i] = mc.sources(i).weight();
  }
  std::vector<MixtureSegment> out = {{0, -1, w}};
  auto add = [&](uint64_t start, int stage, std::vector<double> weights) {
    if (out.back().start_step == start) out.pop_back();
    out.push_back(MixtureSegment{start, stage, std::move(weights)});
  };
  for (int k = 0; k < mc.stages_size(); ++k) {
    const v1::MixtureStage& st = mc.stages(k);
    std::vector<double> next = w;
    for (const v1::SourceWeight& sw : st.weights()) next[by_name[sw.source()]] = sw.weight();
    const uint64_t ramp = st.ramp_steps();
    if (ramp > 0) {
      // Stairs of constant weights: stair i holds the interpolation at its
      // middle, (i + 1/2) / n of the way.
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(kRampStairs, ramp));
      for (uint32_t i = 0; i < n; ++i) {
        const double f = (i + 0.5) / n;
        std::vector<double> mid(w.size());
        for (size_t s = 0; s < w.size(); ++s) mid[s] = w[s] + (next[s] - w[s]) * f;
        add(st.start_step() + ramp * i / n, k, std::move(mid));
      }
      add(st.start_step() + ramp, k, next);
    } else {
      add(st.start_step(), k, next);
    }
    w = std::move(next);
  }
  segments_ = std::move(out);
}

absl::Status Mixture::BuildStreams(const v1::JobConfig& config,
                                   const absl::Span<const uint32_t> streams[2],
                                   const uint32_t per_step[2]) {
  const v1::MixtureConfig& mc = config.mixture();
  for (const int vl : {0, 1}) {
    const uint32_t N = per_step[vl];
    if (N == 0) continue;
    std::vector<uint32_t>& slots = stream_sources_[vl];
    std::vector<std::string> holders;
    for (uint32_t i = 0; i < sources_.size(); ++i) {
      if (sources_[i].part[vl].n == 0) continue;
      holders.push_back(sources_[i].name);
      bool weighted = false;
      for (const MixtureSegment& g : segments_) weighted |= g.weights[i] > 0;
      if (!weighted) continue;
      sources_[i].part[vl].slot = static_cast<int32_t>(slots.size());
      slots.push_back(i);
    }
    if (holders.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "batch.", PerStepField(vl), " is ", N, " but no mixture source holds ", StreamName(vl),
          " samples (that the stager can serve); add a source that does, or set batch.",
          PerStepField(vl), " to 0"));
    }
    std::vector<ApportionSegment> segs;
    for (const MixtureSegment& g : segments_) {
      std::vector<double> w;
      double total = 0;
      for (uint32_t i : slots) total += g.weights[i], w.push_back(g.weights[i]);
      if (!(total > 0)) {
        const std::string where =
            g.stage < 0
                ? std::string("the sources' own weights (before mixture.stages[0])")
                : absl::StrCat("mixture.stages[", g.stage, "] (from step ", g.start_step, ")");
        return absl::FailedPreconditionError(absl::StrCat(
            "at ", where, " every source holding ", StreamName(vl), " samples (",
            absl::StrJoin(holders, ", "), ") has weight 0, but batch.", PerStepField(vl), " is ", N,
            ": no source can fill the step; give one of them a weight there, or set batch.",
            PerStepField(vl), " to 0"));
      }
      ApportionSegment a{g.start_step, ExactWeights(w)};
      if (!segs.empty() && segs.back().weights == a.weights) continue;  // unchanged
      segs.push_back(std::move(a));
    }
    apportion_[vl] =
        std::make_unique<Apportionment>(N, static_cast<uint32_t>(slots.size()), std::move(segs));
    const Apportionment& a = *apportion_[vl];
    for (uint32_t slot = 0; slot < slots.size(); ++slot) {
      const SourcePart& part = sources_[slots[slot]].part[vl];
      const uint64_t most = a.MaxCount(slot);
      // A step drawing one sample of it never repeats one; more need an
      // epoch of at least two steps' draws (sampler.h).
      if (most >= 2 && part.epoch_size < 2 * most) {
        // The largest share it may have: half its epoch.
        return absl::FailedPreconditionError(absl::StrCat(
            "mixture.sources[", slots[slot], "] ('", sources_[slots[slot]].name, "') holds ",
            part.n, " ", StreamName(vl), " samples (a source-epoch of ", part.epoch_size,
            ") but its weight gives it up to ", most, " of the ", N,
            " a step draws: a step that crosses its epochs would need a sample twice. A source "
            "draws at most half its epoch a step: lower its weight so that its share stays at or "
            "below ",
            part.epoch_size / 2,
            " samples a step, raise max_samples_per_epoch, or give it more "
            "samples"));
      }
      epoch_samples_[vl] += part.epoch_size;
      blocks_[vl].push_back(std::make_unique<SlotBlocks>(apportion_[vl].get(), slot));
    }
  }
  (void)mc;
  (void)streams;
  return absl::OkStatus();
}

void Mixture::BuildHistory(const v1::JobConfig& config) {
  const v1::MixtureConfig& mc = config.mixture();
  // Entry e covers the segments that start before the next entry's stage:
  // the sources that have weight in them, with their settings, and the
  // weights themselves.
  std::vector<uint64_t> starts = {0};
  for (const v1::MixtureStage& st : mc.stages()) {
    if (st.start_step() > 0) starts.push_back(st.start_step());
  }
  for (size_t e = 0; e < starts.size(); ++e) {
    const uint64_t until = e + 1 < starts.size() ? starts[e + 1] : UINT64_MAX;
    std::string bytes =
        absl::StrCat("seed=", config.seed(), " text=", config.batch().text_samples_per_step(),
                     " vl=", config.batch().vl_samples_per_step(), "\n");
    std::vector<bool> used(sources_.size(), false);
    for (const MixtureSegment& g : segments_) {
      if (g.start_step >= until) break;
      absl::StrAppend(&bytes, "from ", g.start_step, ":");
      for (size_t i = 0; i < sources_.size(); ++i) {
        if (g.weights[i] <= 0) continue;
        used[i] = true;
        absl::StrAppend(&bytes, " ", sources_[i].name, "=", absl::StrFormat("%.17g", g.weights[i]));
      }
      absl::StrAppend(&bytes, "\n");
    }
    for (size_t i = 0; i < sources_.size(); ++i) {
      if (!used[i]) continue;
      const v1::MixtureSource& cs = mc.sources(static_cast<int>(i));
      absl::StrAppend(&bytes, "source ", cs.name(),
                      " prefixes=", absl::StrJoin(cs.shard_prefixes(), ","),
                      " modality=", cs.modality(), " cap=", cs.max_samples_per_epoch(),
                      " max_pixels=", cs.max_pixels(), " long=", cs.long_documents(),
                      " text=", sources_[i].part[0].n, " vl=", sources_[i].part[1].n, "\n");
    }
    history_.emplace_back(starts[e], Digest(bytes));
  }
}

void Mixture::LayoutOf(bool vl, uint64_t step, Layout* out) const {
  const Apportionment& a = *apportion_[vl];
  const uint32_t S = a.sources(), N = per_step_[vl];
  thread_local std::vector<uint32_t> count, bucket;
  count.resize(S);
  out->before.resize(S);
  a.At(step, count.data(), out->before.data());
  // The k-th of a slot's c samples goes to bucket floor((2k + 1) N / 2c);
  // positions follow the buckets, a bucket's entries in slot order.
  bucket.assign(size_t{N} + 1, 0);
  for (uint32_t s = 0; s < S; ++s) {
    for (uint32_t k = 0; k < count[s]; ++k) {
      ++bucket[(uint64_t{2} * k + 1) * N / (uint64_t{2} * count[s]) + 1];
    }
  }
  for (uint32_t b = 0; b < N; ++b) bucket[b + 1] += bucket[b];
  out->slot.resize(N);
  out->k.resize(N);
  for (uint32_t s = 0; s < S; ++s) {
    for (uint32_t k = 0; k < count[s]; ++k) {
      const uint32_t j = bucket[(uint64_t{2} * k + 1) * N / (uint64_t{2} * count[s])]++;
      out->slot[j] = static_cast<uint16_t>(s);
      out->k[j] = k;
    }
  }
}

void Mixture::Draw(bool vl, const uint64_t* pos, size_t count, uint32_t* sample,
                   uint8_t* source) const {
  if (count == 0) return;
  const uint32_t N = per_step_[vl];
  const std::vector<uint32_t>& slots = stream_sources_[vl];
  // The steps' layouts, a few kept per thread (the draw and the admission
  // of a step, and the recovery of a deferral queue, ask for the same ones).
  struct Cached {
    uint64_t id = 0, step = 0;
    bool vl = false;
    Layout layout;
  };
  constexpr size_t kCached = 16;
  thread_local Cached cache[kCached];
  thread_local size_t cache_next = 0;
  const Layout* last = nullptr;
  uint64_t last_step = UINT64_MAX;
  auto layout = [&](uint64_t step) -> const Layout& {
    if (step == last_step) return *last;
    for (Cached& c : cache) {
      if (c.id == id_ && c.vl == vl && c.step == step) {
        last_step = step;
        return *(last = &c.layout);
      }
    }
    Cached& c = cache[cache_next];
    cache_next = (cache_next + 1) % kCached;
    c.id = id_;
    c.vl = vl;
    c.step = step;
    LayoutOf(vl, step, &c.layout);
    last_step = step;
    return *(last = &c.layout);
  };
  // Each position's slot and source position, grouped by slot (a counting
  // sort), then each slot's positions through its sampler in one batch.
  const uint32_t S = static_cast<uint32_t>(slots.size());
  thread_local std::vector<uint16_t> slot_of;
  thread_local std::vector<uint64_t> q_of, qs, local;
  thread_local std::vector<uint32_t> begin, at;
  slot_of.resize(count);
  q_of.resize(count);
  begin.assign(size_t{S} + 1, 0);
  // Consecutive positions (a range, as admission asks) step through the
  // layouts without a division each.
  uint64_t step = pos[0] / N;
  uint32_t j = static_cast<uint32_t>(pos[0] - step * N);
  for (size_t k = 0; k < count; ++k) {
    if (k > 0) {
      if (pos[k] == pos[k - 1] + 1) {
        if (++j == N) j = 0, ++step;
      } else {
        step = pos[k] / N;
        j = static_cast<uint32_t>(pos[k] - step * N);
      }
    }
    const Layout& L = layout(step);
    const uint16_t slot = L.slot[j];
    slot_of[k] = slot;
    q_of[k] = L.before[slot] + L.k[j];
    ++begin[slot + 1];
  }
  for (uint32_t s = 0; s < S; ++s) begin[s + 1] += begin[s];
  qs.resize(count);
  at.resize(count);
  local.resize(count);
  {
    thread_local std::vector<uint32_t> fill;
    fill.assign(begin.begin(), begin.end() - 1);
    for (size_t k = 0; k < count; ++k) {
      const uint32_t x = fill[slot_of[k]]++;
      qs[x] = q_of[k];
      at[x] = static_cast<uint32_t>(k);
    }
  }
  const absl::Span<const uint32_t> list = streams_[vl];
  for (uint32_t slot = 0; slot < S; ++slot) {
    const uint32_t b = begin[slot], e = begin[slot + 1];
    if (b == e) continue;
    const uint32_t i = slots[slot];
    const SourcePart& part = sources_[i].part[vl];
    StreamOptions o;
    o.key = part.key;
    o.n = part.n;
    o.epoch_size = part.epoch_size;
    o.max_block = apportion_[vl]->MaxCount(slot);
    o.blocks = blocks_[vl][slot].get();
    StreamSampler sampler(seed_, o);
    sampler.AtMany(qs.data() + b, e - b, local.data() + b);
    for (uint32_t x = b; x < e; ++x) {
      sample[at[x]] = list[part.ListIndex(local[x])];
      source[at[x]] = static_cast<uint8_t>(i);
    }
  }
}

uint64_t Mixture::Before(bool vl, uint32_t source, uint64_t step) const {
  const int32_t slot = sources_[source].part[vl].slot;
  if (slot < 0 || apportion_[vl] == nullptr) return 0;
  return apportion_[vl]->Before(step, static_cast<uint32_t>(slot));
}

double Mixture::Share(bool vl, uint32_t source, uint64_t step) const {
  const int32_t slot = sources_[source].part[vl].slot;
  if (slot < 0 || apportion_[vl] == nullptr) return 0;
  return apportion_[vl]->Share(step, static_cast<uint32_t>(slot));
}

}  // namespace tutti::packer

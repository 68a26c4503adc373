#include "services/packer/bench/post_workload.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tutti::dispatch {
namespace {

// SplitMix64: small, fast, identical everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double Uniform() { return (Next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  uint32_t Int(uint32_t lo, uint32_t hi) {  // [lo, hi]
    return lo + static_cast<uint32_t>(Next() % (uint64_t{hi} - lo + 1));
  }
  double Normal() {  // Box-Muller
    const double u1 = 1.0 - Uniform(), u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
  }
  double LogNormal(double median, double sigma) { return median * std::exp(sigma * Normal()); }

 private:
  uint64_t s_;
};

uint32_t Tokens(double x) { return std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(x))); }

}  // namespace

absl::StatusOr<Workload> GenerateWorkload(const WorkloadOptions& o) {
  if (o.world_size == 0 || o.ranks_per_node == 0 || o.world_size % o.ranks_per_node != 0) {
    return absl::InvalidArgumentError(absl::StrCat("workload world_size ", o.world_size,
                                                   " must be a multiple of ranks_per_node ",
                                                   o.ranks_per_node));
  }
  if (o.seq_len == 0 || o.text_sequences + o.vl_sequences == 0 || !(o.fill > 0 && o.fill <= 1) ||
      o.max_images == 0 || o.shards == 0 || !(o.audio_share >= 0 && o.audio_share <= 1)) {
    return absl::InvalidArgumentError(
        "workload needs seq_len > 0, at least one sequence per rank, fill in (0, 1], "
        "max_images >= 1, shards >= 1 and audio_share in [0, 1]");
  }
  Workload w;
  const uint32_t nodes = o.world_size / o.ranks_per_node;
  if (o.shard_nodes > 0) {
    w.input.availability = ShardAvailability::None(o.shards, nodes);
    for (uint32_t s = 0; s < o.shards; ++s) {
      for (uint32_t k = 0; k < std::min(o.shard_nodes, nodes); ++k) {
        w.input.availability.Set(s, (s + k) % nodes, true);
      }
    }
  }
  DispatchOptions& d = w.options;
  d.cluster = {o.world_size, o.ranks_per_node};
  d.slots.seq_len = o.seq_len;
  d.slots.text_micro_batches = o.text_sequences;
  d.slots.text_micro_batch = 1;
  d.slots.vl_micro_batches = o.vl_sequences;
  d.slots.vl_micro_batch = 1;

  Rng rng(o.seed);
  const uint64_t room_text = uint64_t{o.world_size} * o.text_sequences * o.seq_len;
  const uint64_t room_vl = uint64_t{o.world_size} * o.vl_sequences * o.seq_len;
  const double want_text = o.fill * room_text, want_vl = o.fill * room_vl;
  uint64_t have_text = 0, have_vl = 0;
  uint64_t next_id = 0;
  auto& samples = w.input.samples;
  auto make_vl = [&](Sample* s) -> bool {
    s->vl = true;
    s->text_tokens = Tokens(rng.LogNormal(o.vl_text_median_tokens, o.vl_text_sigma));
    uint64_t tokens = s->text_tokens;
    if (rng.Uniform() < o.audio_share) {
      const double seconds = rng.Uniform(1.0, 30.0);
      EncoderItem clip;
      clip.index = 0;
      clip.frames = static_cast<uint32_t>(seconds * 100);
      clip.units = clip.output_tokens = std::max<uint32_t>(1, clip.frames / 4);
      clip.input_bytes = static_cast<uint64_t>(seconds * o.audio_sample_rate) * 4;
      tokens += clip.output_tokens + 2;
      s->items[int(EncoderKind::kAudio)].push_back(clip);
    } else {
      const uint32_t images = rng.Int(1, o.max_images);
      for (uint32_t k = 0; k < images; ++k) {
        const double mp = rng.Uniform() < o.large_image_fraction
                              ? rng.Uniform(o.small_max_mp, o.large_max_mp)
                              : rng.Uniform(o.min_mp, o.small_max_mp);
        const double aspect = std::exp(rng.Uniform(std::log(0.5), std::log(2.0)));
        const double area = mp * 1e6;
        const auto h = static_cast<uint32_t>(std::max(1.0, std::sqrt(area / aspect)));
        const auto wd = static_cast<uint32_t>(std::max(1.0, std::sqrt(area * aspect)));
        absl::StatusOr<ImageGeometry> g = SmartResize(h, wd, o.geometry);
        if (!g.ok()) return false;
        EncoderItem img;
        img.index = k;
        img.units = g->patches;
        img.output_tokens = g->llm_tokens;
        img.input_bytes = PixelBytes(g->patches, o.geometry.temporal_patch, o.geometry.patch_size,
                                     o.pixel_dtype_bytes);
        img.height = g->height, img.width = g->width;
        img.grid_t = g->grid_t, img.grid_h = g->grid_h, img.grid_w = g->grid_w;
        tokens += img.output_tokens + 2;  // vision_start ... vision_end
        s->items[int(EncoderKind::kVision)].push_back(img);
      }
    }
    s->llm_tokens = static_cast<uint32_t>(std::min<uint64_t>(tokens, ~0u));
    return tokens <= o.seq_len;
  };
  const double p_vl = 0.2;  // draw order only; the totals come from the fill
  while (have_text < want_text || have_vl < want_vl) {
    bool vl = rng.Uniform() < p_vl;
    if (vl && have_vl >= want_vl) vl = false;
    if (!vl && have_text >= want_text) vl = true;
    Sample s;
    s.sample_id = next_id++;
    s.shard = static_cast<uint32_t>(rng.Next() % o.shards);
    bool ok;
    if (vl) {
      ok = make_vl(&s);
    } else {
      s.text_tokens = Tokens(rng.LogNormal(o.text_median_tokens, o.text_sigma));
      s.llm_tokens = s.text_tokens;
      ok = s.llm_tokens <= o.seq_len;
    }
    // A sample longer than seq_len, or one that would overflow its
    // modality's room, is drawn again.
    uint64_t& have = vl ? have_vl : have_text;
    const uint64_t room = vl ? room_vl : room_text;
    if (!ok || have + s.llm_tokens > room) {
      if (++w.rejected > 1000000) {
        return absl::InvalidArgumentError("workload samples almost never fit seq_len; raise it");
      }
      continue;
    }
    have += s.llm_tokens;
    s.drawn_rank = static_cast<uint32_t>(samples.size() % o.world_size);
    if (vl) {
      ++w.vl_samples;
      w.images += s.items[int(EncoderKind::kVision)].size();
      w.audio_clips += s.items[int(EncoderKind::kAudio)].size();
    } else {
      ++w.text_samples;
    }
    samples.push_back(std::move(s));
  }
  return w;
}

}  // namespace tutti::dispatch

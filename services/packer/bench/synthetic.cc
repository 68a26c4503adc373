#include "services/packer/bench/synthetic.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rng.h"
#include "common/status.h"
#include "services/packer/index/index.h"

namespace tutti::packer {
namespace {

struct Image {
  uint32_t width, height;
};

}  // namespace

namespace {

absl::Status Generate(const SyntheticOptions& o, IndexWriter* w) {
  if (o.samples == 0 || o.samples >= UINT32_MAX) {
    return absl::InvalidArgumentError("synthetic sample count must be in [1, 4e9)");
  }
  // The project's own generator: a seed names the same dataset on every
  // standard library (<random>'s distributions are implementation-defined).
  Rng rng(o.seed);
  auto lognormal = [&](double median, double sigma, uint32_t max) {
    const double v = rng.LogNormal(median, sigma);
    return static_cast<uint32_t>(std::clamp(v, 1.0, double(max)));
  };
  auto draw_image = [&]() {
    const bool big = rng.Uniform() < o.big_image_fraction;
    const double lo = big ? o.small_max_pixels : o.min_pixels;
    const double hi = big ? o.big_max_pixels : o.small_max_pixels;
    const double area = std::exp(std::log(lo) + rng.Uniform() * (std::log(hi) - std::log(lo)));
    const double aspect = std::exp((rng.Uniform() * 2 - 1) * std::log(2.0));
    const double w = std::sqrt(area * aspect), h = area / w;
    return Image{static_cast<uint32_t>(std::clamp(w, 28.0, 65000.0)),
                 static_cast<uint32_t>(std::clamp(h, 28.0, 65000.0))};
  };
  VisionGeometryOptions fit = o.geometry;
  fit.max_pixels = o.fit_max_pixels;

  w->SetSourceDir("synthetic");
  w->AddMeta("builder", absl::StrCat("synthetic seed=", o.seed, " samples=", o.samples));
  const uint64_t expected_media =
      static_cast<uint64_t>(o.samples * o.vl_fraction * (o.min_images + o.max_images) / 2.0 * 1.1) +
      16;
  w->Reserve(o.samples, expected_media, o.samples * 9);  // in memory only
  std::vector<Image> images;
  std::vector<MemberInput> media;
  const uint32_t per_shard = std::max<uint32_t>(1, o.samples_per_shard);
  for (uint64_t s = 0; s < o.samples; ++s) {
    if (s % per_shard == 0) {
      // Shard sizes are a generous bound of the fabricated member layout.
      RETURN_IF_ERROR(w->AddShard(absl::StrFormat("synthetic-%06u.tar", s / per_shard),
                                  uint64_t{per_shard} << 30, 0));
    }
    const bool vl = rng.Uniform() < o.vl_fraction;
    uint32_t text = 0;
    images.clear();
    bool with_audio = false;
    for (int attempt = 0; attempt < 100; ++attempt) {
      images.clear();
      if (!vl) {
        text = lognormal(o.text_median_tokens, o.text_sigma, o.max_text_tokens);
      } else {
        text = lognormal(o.vl_text_median_tokens, o.vl_text_sigma, o.max_text_tokens);
        const uint32_t n =
            o.min_images + static_cast<uint32_t>(rng.Uniform() * (o.max_images - o.min_images + 1));
        for (uint32_t k = 0; k < std::min(n, o.max_images); ++k) images.push_back(draw_image());
        with_audio = rng.Uniform() < o.audio_fraction;
      }
      if (o.fit_seq_len == 0) break;
      uint64_t tokens = text + (with_audio ? 302 : 0);
      for (const Image& im : images) {
        auto g = SmartResize(im.height, im.width, fit);
        if (!g.ok()) return g.status();
        tokens += g->llm_tokens + 2;
      }
      if (tokens <= o.fit_seq_len) break;
      if (attempt == 99) {
        return absl::InvalidArgumentError(
            absl::StrCat("synthetic samples keep exceeding fit_seq_len ", o.fit_seq_len,
                         "; raise it or draw smaller images"));
      }
    }
    // Fabricated member layout: json, then images, inside a 1 GiB slot per sample.
    const uint64_t base = (s % per_shard) << 30;
    MemberInput json{MemberKind::kJson, "json", base + 512, uint64_t{text} * 6 + 16};
    uint64_t off = json.offset + json.size + 1024;
    media.clear();
    for (size_t k = 0; k < images.size(); ++k) {
      MemberInput m;
      m.kind = MemberKind::kJpeg;
      m.ext = images.size() == 1 ? "jpg" : absl::StrCat(k, ".jpg");
      m.offset = off;
      m.size = uint64_t{images[k].width} * images[k].height / 4 + 1024;
      m.width = images[k].width;
      m.height = images[k].height;
      off += m.size + 1024;
      media.push_back(m);
    }
    if (with_audio) {
      MemberInput a;
      a.kind = MemberKind::kWav;
      a.ext = "wav";
      a.offset = off;
      a.audio_ms = 12000;
      a.size = 16000 * 2 * 12 + 44;
      media.push_back(a);
    }
    RETURN_IF_ERROR(w->AddSample(absl::StrFormat("%09u", s), text, &json, media));
  }
  return absl::OkStatus();
}

}  // namespace

SyntheticOptions SyntheticFromWorkload(const WorkloadMix& mix, uint64_t samples) {
  SyntheticOptions o;
  o.samples = samples;
  o.vl_fraction = mix.vl_fraction;
  o.text_median_tokens = mix.text_median_tokens;
  o.text_sigma = mix.text_sigma;
  o.vl_text_median_tokens = mix.vl_text_median_tokens;
  o.vl_text_sigma = mix.vl_text_sigma;
  o.min_images = mix.min_images;
  o.max_images = mix.max_images;
  o.big_image_fraction = mix.big_image_fraction;
  o.min_pixels = mix.min_pixels;
  o.small_max_pixels = mix.small_max_pixels;
  o.big_max_pixels = mix.big_max_pixels;
  return o;
}

absl::StatusOr<std::string> MakeSyntheticIndex(const SyntheticOptions& o) {
  IndexWriter w;
  RETURN_IF_ERROR(Generate(o, &w));
  return w.Finish();
}

absl::Status WriteSyntheticIndex(const SyntheticOptions& o, const std::string& path) {
  IndexWriter w;
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  RETURN_IF_ERROR(w.SpillTo(dir));
  RETURN_IF_ERROR(Generate(o, &w));
  return w.WriteFile(path);
}

}  // namespace tutti::packer

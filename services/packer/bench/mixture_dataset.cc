#include "services/packer/bench/mixture_dataset.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rng.h"
#include "common/status.h"
#include "services/packer/index/index.h"

namespace tutti::packer {

absl::StatusOr<std::string> MakeMixtureIndex(const MixtureDatasetOptions& o) {
  Rng rng(o.seed);
  IndexWriter w;
  w.SetSourceDir("mixture");
  w.AddMeta("builder", absl::StrCat("mixture seed=", o.seed, " sources=", o.sources.size()));
  const uint32_t per_shard = std::max<uint32_t>(1, o.samples_per_shard);
  uint64_t total = 0;
  for (const MixtureDatasetSource& src : o.sources) total += src.samples;
  if (total == 0 || total >= UINT32_MAX) {
    return absl::InvalidArgumentError("a mixture dataset holds 1 to 4e9 samples");
  }
  w.Reserve(total, total / 2 + 16, total * 12);
  std::vector<MemberInput> media;
  for (const MixtureDatasetSource& src : o.sources) {
    for (uint64_t s = 0; s < src.samples; ++s) {
      if (s % per_shard == 0) {
        RETURN_IF_ERROR(w.AddShard(absl::StrFormat("%s/%06u.tar", src.name, s / per_shard),
                                   uint64_t{per_shard} << 30, 0));
      }
      const bool vl = rng.Uniform() < src.vl_fraction;
      const uint32_t text = static_cast<uint32_t>(
          std::clamp(rng.LogNormal(vl ? o.vl_text_median_tokens : o.text_median_tokens, 0.8), 1.0,
                     vl ? 1500.0 : 3900.0));
      const uint64_t base = uint64_t{static_cast<uint32_t>(s % per_shard)} << 30;
      MemberInput json{MemberKind::kJson, "json", base + 512, uint64_t{text} * 6 + 16};
      media.clear();
      uint64_t off = json.offset + json.size + 1024;
      if (vl) {
        const uint32_t images = rng.Uniform() < 0.8 ? 1 : 2;
        for (uint32_t k = 0; k < images; ++k) {
          const double area = rng.LogUniform(2e4, o.max_image_pixels);
          const double aspect = rng.LogUniform(0.5, 2.0);
          MemberInput m;
          m.kind = MemberKind::kJpeg;
          m.ext = absl::StrCat(k, ".jpg");
          m.width = static_cast<uint32_t>(std::max(28.0, std::sqrt(area * aspect)));
          m.height = static_cast<uint32_t>(std::max(28.0, area / m.width));
          m.offset = off;
          m.size = uint64_t{m.width} * m.height / 4 + 1024;
          off += m.size + 1024;
          media.push_back(m);
        }
      }
      RETURN_IF_ERROR(w.AddSample(absl::StrFormat("%s-%08u", src.name, s), text, &json, media));
    }
  }
  return w.Finish();
}

MixtureDatasetOptions FineVisionShape(uint32_t sources, uint64_t total_samples, uint64_t seed) {
  MixtureDatasetOptions o;
  o.seed = seed;
  Rng rng(seed ^ 0xF1E2);
  std::vector<double> size(sources);
  double sum = 0;
  for (uint32_t i = 0; i < sources; ++i) {
    // Log-uniform over three orders, the extremes pinned.
    const double f = sources > 1 ? (i == 0 ? 0 : i == 1 ? 1 : rng.Uniform()) : 1;
    sum += size[i] = std::pow(1000.0, f);
  }
  for (uint32_t i = 0; i < sources; ++i) {
    MixtureDatasetSource s;
    s.name = absl::StrFormat("s%03u", i);
    s.samples = std::max<uint64_t>(
        1, static_cast<uint64_t>(std::llround(size[i] / sum * static_cast<double>(total_samples))));
    s.vl_fraction = i % 4 == 3 ? 0.0 : 1.0;
    o.sources.push_back(s);
  }
  return o;
}

std::string MixtureConfigText(const MixtureDatasetOptions& o, bool by_size) {
  std::string out = "mixture {\n";
  for (const MixtureDatasetSource& s : o.sources) {
    absl::StrAppend(&out, "  sources { name: '", s.name, "' shard_prefixes: '", s.name,
                    "/' weight: ", by_size ? s.samples : 1, " }\n");
  }
  return out + "}\n";
}

absl::StatusOr<std::string> ReshardIntoSources(const Index& index, uint32_t text_sources,
                                               uint32_t vl_sources, uint32_t samples_per_shard,
                                               uint64_t seed,
                                               std::vector<MixtureDatasetSource>* sources) {
  Rng rng(seed ^ 0x5EA5);
  const absl::Span<const uint32_t> lists[2] = {index.text_samples(), index.vl_samples()};
  const uint32_t counts[2] = {text_sources, vl_sources};
  // Per group: sizes log-uniform over three orders (the extremes pinned),
  // scaled to the group's samples, at least one each.
  struct Group {
    std::vector<uint64_t> sizes;
  };
  Group groups[2];
  for (int vl = 0; vl < 2; ++vl) {
    const uint64_t n = lists[vl].size();
    const uint32_t k = counts[vl];
    if (k == 0 && n > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the index has ", vl ? "VL" : "text-only", " samples for no source"));
    }
    if (uint64_t{k} * 8 > n) {
      return absl::InvalidArgumentError(absl::StrCat("too few ", vl ? "VL" : "text-only",
                                                     " samples (", n, ") for ", k, " sources"));
    }
    std::vector<double> w(k);
    double sum = 0;
    for (uint32_t i = 0; i < k; ++i) {
      sum += w[i] = std::pow(1000.0, k > 1 ? (i == 0 ? 0.0 : i == 1 ? 1.0 : rng.Uniform()) : 1.0);
    }
    uint64_t given = 0;
    groups[vl].sizes.resize(k);
    for (uint32_t i = 0; i < k; ++i) {
      groups[vl].sizes[i] = std::max<uint64_t>(4, static_cast<uint64_t>(w[i] / sum * n));
      given += groups[vl].sizes[i];
    }
    // What rounding left over goes to (or comes from) the largest.
    auto largest = std::max_element(groups[vl].sizes.begin(), groups[vl].sizes.end());
    *largest = *largest + n - given;
  }
  IndexWriter w;
  w.SetSourceDir("fine-vision-shape");
  w.AddMeta("builder", absl::StrCat("resharded into ", text_sources, " text-only and ", vl_sources,
                                    " VL sources"));
  w.Reserve(index.num_samples(), index.num_media(), uint64_t{index.num_samples()} * 12);
  sources->clear();
  // Members keep their offsets: every shard is as large as the largest.
  uint64_t shard_bytes = 0;
  for (const IndexShard& sh : index.shards()) shard_bytes = std::max(shard_bytes, sh.size);
  // Sources interleaved in name order: a text-only one every fourth.
  size_t next[2] = {0, 0}, at[2] = {0, 0};
  const uint32_t total = text_sources + vl_sources;
  for (uint32_t i = 0; i < total; ++i) {
    int vl = (i % 4 == 3 && next[0] < text_sources) || next[1] >= vl_sources ? 0 : 1;
    const uint64_t size = groups[vl].sizes[next[vl]++];
    MixtureDatasetSource src{absl::StrFormat("s%03u", i), size, vl ? 1.0 : 0.0};
    for (uint64_t k = 0; k < size; ++k) {
      if (k % samples_per_shard == 0) {
        RETURN_IF_ERROR(w.AddShard(absl::StrFormat("%s/%06u.tar", src.name, k / samples_per_shard),
                                   shard_bytes, 0));
      }
      const uint32_t s = lists[vl][at[vl]++];
      RETURN_IF_ERROR(w.CopySample(index, s));
    }
    sources->push_back(std::move(src));
  }
  return w.Finish();
}

}  // namespace tutti::packer

#include "common/mixture_config.h"

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/job_limits.h"

namespace tutti {
namespace {

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

absl::Status CheckWeight(double w, const std::string& field) {
  if (std::isfinite(w) && w >= 0 && w <= kMaxSourceWeight) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, " is ", w,
      ": a weight is a finite share from 0 (not drawn) to 1e9, relative to the other sources'; "
      "give e.g. 0.3, or 30 next to the others' 70"));
}

}  // namespace

absl::Status ValidateMixtureConfig(const v1::JobConfig& c) {
  if (!c.has_mixture()) return absl::OkStatus();
  const v1::MixtureConfig& m = c.mixture();
  if (m.sources_size() == 0) {
    return absl::InvalidArgumentError(
        "mixture has no sources; name at least one (mixture { sources { name: 'all' weight: 1 } }) "
        "or remove the mixture to draw the index's text and VL streams");
  }
  if (m.sources_size() > kMaxMixtureSources) {
    return absl::InvalidArgumentError(absl::StrCat("mixture has ", m.sources_size(),
                                                   " sources, more than ", kMaxMixtureSources,
                                                   "; merge small sources into one (a shared "
                                                   "shard_prefixes directory)"));
  }
  const v1::VisionConfig& v = c.vision();
  const uint64_t factor = uint64_t{v.patch_size()} * v.merge_size();
  absl::flat_hash_map<std::string, int> names;
  for (int i = 0; i < m.sources_size(); ++i) {
    const v1::MixtureSource& s = m.sources(i);
    const std::string at = absl::StrCat("mixture.sources[", i, "]");
    const std::string& n = s.name();
    bool ok = !n.empty() && n.size() <= kMaxSourceNameBytes;
    for (char ch : n) ok &= NameChar(ch);
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".name '", n, "' is not a source name: 1 to ", kMaxSourceNameBytes,
                       " characters of letters, digits, '.', '_' and '-' (it labels metrics)"));
    }
    if (!names.emplace(n, i).second) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".name '", n, "' is also mixture.sources[",
                                                     names[n], "]'s; give each source its own"));
    }
    if (s.shard_prefixes_size() > kMaxShardPrefixes) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".shard_prefixes has ", s.shard_prefixes_size(), " entries, more than ",
                       kMaxShardPrefixes, "; use shorter prefixes"));
    }
    std::set<std::string> prefixes;
    for (int k = 0; k < s.shard_prefixes_size(); ++k) {
      const std::string& p = s.shard_prefixes(k);
      if (p.empty() || p.size() > kMaxShardPrefixBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, ".shard_prefixes[", k, "] is ", p.size(), " bytes; a prefix is 1 to ",
            kMaxShardPrefixBytes, " bytes of a shard name, e.g. 'ocr/' (omit the field for all)"));
      }
      if (!prefixes.insert(p).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ".shard_prefixes names '", p, "' twice; list it once"));
      }
    }
    if (s.modality() != v1::MODALITY_UNSPECIFIED && s.modality() != v1::MODALITY_TEXT &&
        s.modality() != v1::MODALITY_VL) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".modality ", s.modality(),
                       " is unknown; use MODALITY_TEXT, MODALITY_VL or leave it unset (both)"));
    }
    if (absl::Status w = CheckWeight(s.weight(), at + ".weight"); !w.ok()) return w;
    if (s.max_samples_per_epoch() > kMaxSamplesPerEpoch) {
      return absl::InvalidArgumentError(absl::StrCat(at, ".max_samples_per_epoch ",
                                                     s.max_samples_per_epoch(),
                                                     " is above 2^32; use 0 for "
                                                     "every sample"));
    }
    if (s.max_pixels() > kMaxPixels) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".max_pixels ", s.max_pixels(), " is outside its range 0..", kMaxPixels,
                       " (0: no ceiling below the curriculum's max_pixels)"));
    }
    if (s.max_pixels() != 0 &&
        (s.max_pixels() < v.min_pixels() || s.max_pixels() < factor * factor)) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ".max_pixels ", s.max_pixels(), " is below vision.min_pixels ", v.min_pixels(),
          " or one merged patch (", factor * factor, " pixels); raise it, or 0 for no ceiling"));
    }
    const std::string& ld = s.long_documents();
    if (!ld.empty() && ld != "split" && ld != "truncate" && ld != "skip") {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".long_documents '", ld,
                       "' is unknown; use 'split', 'truncate', 'skip' or leave it "
                       "empty for overflow.long_documents"));
    }
  }
  // The weights in force, stage by stage: never all zero.
  std::vector<double> weights(m.sources_size());
  double total = 0;
  for (int i = 0; i < m.sources_size(); ++i) total += weights[i] = m.sources(i).weight();
  if (m.stages_size() == 0 || m.stages(0).start_step() > 0) {
    if (total <= 0) {
      return absl::InvalidArgumentError(
          "every mixture.sources[].weight is 0, so step 0 draws from no source; give the "
          "sources their weights (e.g. weight: 1), or start mixture.stages[0] at step 0");
    }
  }
  if (m.stages_size() > kMaxMixtureStages) {
    return absl::InvalidArgumentError(absl::StrCat("mixture.stages has ", m.stages_size(),
                                                   " stages, more than ", kMaxMixtureStages));
  }
  for (int k = 0; k < m.stages_size(); ++k) {
    const v1::MixtureStage& st = m.stages(k);
    const std::string at = absl::StrCat("mixture.stages[", k, "]");
    if (k > 0 && st.start_step() <= m.stages(k - 1).start_step()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".start_step ", st.start_step(), " is not after mixture.stages[", k - 1,
                       "].start_step ", m.stages(k - 1).start_step(),
                       ": a schedule only goes forward; list the stages in increasing start_step"));
    }
    std::set<std::string> named;
    for (int j = 0; j < st.weights_size(); ++j) {
      const v1::SourceWeight& w = st.weights(j);
      auto it = names.find(w.source());
      if (it == names.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ".weights[", j, "].source '", w.source(),
                         "' is not a source of the mixture; name one of mixture.sources[].name"));
      }
      if (!named.insert(w.source()).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, ".weights names '", w.source(), "' twice; give each source one weight a stage"));
      }
      if (absl::Status s = CheckWeight(w.weight(), absl::StrCat(at, ".weights[", j, "].weight"));
          !s.ok()) {
        return s;
      }
      weights[it->second] = w.weight();
    }
    total = 0;
    for (double w : weights) total += w;
    if (total <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, " (start_step ", st.start_step(),
          ") leaves every source at weight 0, so its steps draw from no source; give a source a "
          "weight above 0 there"));
    }
    if (st.ramp_steps() > kMaxRampSteps) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".ramp_steps ", st.ramp_steps(), " is above 1e9"));
    }
    if (k + 1 < m.stages_size() && st.ramp_steps() > 0 &&
        st.start_step() + st.ramp_steps() > m.stages(k + 1).start_step()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".ramp_steps ", st.ramp_steps(), " runs past mixture.stages[", k + 1,
                       "].start_step ", m.stages(k + 1).start_step(), "; shorten it to at most ",
                       m.stages(k + 1).start_step() - st.start_step()));
    }
  }
  return absl::OkStatus();
}

}  // namespace tutti

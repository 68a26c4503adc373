#include "tools/mixture_report.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tutti::tools {

MixtureReport::MixtureReport(const packer::Job& job) : job_(job) {}

int MixtureReport::StageOf(uint64_t step) const {
  const packer::Mixture* m = job_.mixture();
  if (m == nullptr) return -1;
  int stage = -1;
  for (const packer::MixtureSegment& g : m->segments()) {
    if (g.start_step <= step) stage = g.stage;
  }
  return stage;
}

std::string MixtureReport::StageName(int stage) const {
  if (job_.mixture() == nullptr) return "no mixture: the index's text-only and VL streams";
  if (stage < 0) return "the sources' weights";
  const v1::MixtureStage& st = job_.config().mixture().stages(stage);
  return absl::StrCat(
      "mixture.stages[", stage, "] from step ", st.start_step(),
      st.ramp_steps() > 0 ? absl::StrCat(", a ramp of ", st.ramp_steps(), " steps") : "");
}

void MixtureReport::Add(const packer::StepPlanData& d) {
  Stage& st = stages_[StageOf(d.step)];
  st.first = std::min(st.first, d.step);
  st.last = std::max(st.last, d.step);
  for (const packer::PlannedSample& ps : d.samples) {
    if (ps.piece > 0) continue;
    ++st.rows[{ps.vl, ps.source}].planned;
    ++st.planned[ps.vl];
  }
  const packer::Mixture* m = job_.mixture();
  const auto& b = job_.config().batch();
  for (const bool vl : {false, true}) {
    const uint32_t per = vl ? b.vl_samples_per_step() : b.text_samples_per_step();
    if (per == 0) continue;
    if (m == nullptr) {
      Row& r = st.rows[{vl, vl ? 1u : 0u}];
      r.target += per;
      r.drawn += per;
      continue;
    }
    for (uint32_t src : m->stream_sources(vl)) {
      Row& r = st.rows[{vl, src}];
      r.target += m->Share(vl, src, d.step);
      r.drawn += m->Before(vl, src, d.step + 1) - m->Before(vl, src, d.step);
    }
  }
}

std::string MixtureReport::Table() const {
  const auto& b = job_.config().batch();
  std::string out =
      "mixture (per stage: each source's samples in the plans and their share of "
      "their stream, against the weights' share; drawn - target in samples):\n";
  for (const auto& [stage, st] : stages_) {
    absl::StrAppend(&out, "  ", StageName(stage), " (steps ", st.first, "-", st.last, ")\n");
    absl::StrAppendFormat(&out, "    %-24s %-6s %10s %8s %8s %10s %14s\n", "source", "stream",
                          "planned", "share", "target", "drawn", "drawn-target");
    for (const auto& [key, r] : st.rows) {
      const bool vl = key.first;
      const double per = vl ? b.vl_samples_per_step() : b.text_samples_per_step();
      const double steps = static_cast<double>(st.last - st.first + 1);
      const double share = st.planned[vl] > 0 ? double(r.planned) / st.planned[vl] : 0;
      const double target = per > 0 ? r.target / (per * steps) : 0;
      absl::StrAppendFormat(&out, "    %-24s %-6s %10u %7.2f%% %7.2f%% %10u %+14.3f\n",
                            job_.source_name(key.second), vl ? "VL" : "text", r.planned,
                            100 * share, 100 * target, r.drawn, double(r.drawn) - r.target);
    }
  }
  return out;
}

std::string MixtureReport::Json() const {
  const auto& b = job_.config().batch();
  std::string out;
  for (const auto& [stage, st] : stages_) {
    for (const auto& [key, r] : st.rows) {
      const bool vl = key.first;
      const double per = vl ? b.vl_samples_per_step() : b.text_samples_per_step();
      const double steps = static_cast<double>(st.last - st.first + 1);
      absl::StrAppendFormat(
          &out,
          "%s  {\"stage\": %d, \"source\": \"%s\", \"stream\": \"%s\", \"planned\": %u, "
          "\"share\": %.6f, \"target_share\": %.6f, \"drawn\": %u, \"drawn_minus_target\": %.6f}",
          out.empty() ? "" : ",\n", stage, job_.source_name(key.second), vl ? "vl" : "text",
          r.planned, st.planned[vl] > 0 ? double(r.planned) / st.planned[vl] : 0.0,
          per > 0 ? r.target / (per * steps) : 0.0, r.drawn, double(r.drawn) - r.target);
    }
  }
  return out;
}

}  // namespace tutti::tools

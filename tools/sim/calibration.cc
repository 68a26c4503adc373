#include "tools/sim/calibration.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/status.h"

namespace tutti::sim {

absl::StatusOr<CalibrationPairs> ParseCalibration(const std::string& text,
                                                  const std::string& origin) {
  CalibrationPairs out;
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++n;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (line[0] == '#') {
      out.comments.emplace_back(absl::StripAsciiWhitespace(line.substr(1)));
      continue;
    }
    std::vector<absl::string_view> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    double x = 0, seconds = 0;
    if (w.size() != 4 || !absl::SimpleAtod(w[2], &x) || !absl::SimpleAtod(w[3], &seconds) ||
        !std::isfinite(x) || !std::isfinite(seconds) || x <= 0 || seconds <= 0) {
      return absl::DataLossError(absl::StrCat(
          "calibration ", origin, " line ", n, " ('", line,
          "') is not '<phase> <kind> <count> <seconds>' with a positive count and time"));
    }
    const packer::FitSample s{x, x * x, seconds};
    if (w[0] == "vit" && w[1] == "sdpa") {
      out.vit_sdpa.push_back(s);
    } else if (w[0] == "vit" && w[1] == "eager") {
      out.vit_eager.push_back(s);
    } else if (w[0] == "llm") {
      out.llm.push_back(s);
    } else {
      return absl::DataLossError(absl::StrCat("calibration ", origin, " line ", n,
                                              ": unknown pair kind '", w[0], " ", w[1],
                                              "' (vit sdpa, vit eager or llm flash)"));
    }
  }
  return out;
}

absl::StatusOr<CalibrationPairs> ReadCalibration(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseCalibration(text, path);
}

absl::StatusOr<Calibrated> FitCalibration(const CalibrationPairs& p, Attention attention,
                                          const ItemTiming& fallback) {
  packer::FitOptions o;
  o.min_samples = 4;
  o.intercept = false;
  o.max_outlier_share = 0.34;
  const bool eager = attention == Attention::kEager;
  const std::vector<packer::FitSample>& vit = eager ? p.vit_eager : p.vit_sdpa;
  Calibrated c;
  auto v = packer::FitPhase(vit, o);
  if (!v.ok()) {
    return Annotate(v.status(), absl::StrCat("calibration: the ViT's ", eager ? "eager" : "sdpa",
                                             " pairs (", vit.size(), ")"));
  }
  auto l = packer::FitPhase(p.llm, o);
  if (!l.ok()) {
    return Annotate(l.status(), absl::StrCat("calibration: the LLM's pairs (", p.llm.size(), ")"));
  }
  // The time model needs work to cost time: a fit whose ViT terms or LLM
  // linear term is not positive (noisy or too few sizes) is refused here,
  // naming the pairs, rather than by the model later.
  if (!(v->linear > 0) || !(v->quadratic > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration: the ViT's ", eager ? "eager" : "sdpa", " pairs (", vit.size(),
        ") fit a linear term of ", v->linear, " and a quadratic term of ", v->quadratic,
        " s; both must be positive: time more sizes, more repeats, on an idle device"));
  }
  if (!(l->linear > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibration: the LLM's pairs (", p.llm.size(), ") fit a linear term of ", l->linear,
        " s; it must be positive: time more sizes, more repeats, on an idle device"));
  }
  c.vit = *v;
  c.llm = *l;
  c.timing = fallback;
  c.timing.vit_linear = v->linear;
  c.timing.vit_quadratic = v->quadratic;
  c.timing.llm_linear = l->linear;
  c.timing.llm_quadratic = l->quadratic;
  return c;
}

}  // namespace tutti::sim

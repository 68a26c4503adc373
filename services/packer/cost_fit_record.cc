#include "services/packer/cost_fit_record.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace tutti::packer {
namespace {

bool ParseHexDouble(absl::string_view text, double* out) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  *out = std::strtod(s.c_str(), &end);
  return errno == 0 && end == s.c_str() + s.size() && !s.empty() && std::isfinite(*out) &&
         *out >= 0;
}

constexpr StepRecordKind kCostFitRecord{"cost fit record", "--cost_fit_record"};

}  // namespace

std::string FormatCostFitRecord(const CostFitRecordData& d) {
  std::string out = FormatStepRecordHead(
      "# tutti-packerd's online cost fits (job.proto CostFitConfig): the cost constants steps\n"
      "# are planned with from each fit's from_step; constants as C99 hexadecimal floats.\n",
      d.fingerprint, d.planned_through);
  for (const CostFitEntry& f : d.fits) {
    const CostModelOptions& c = f.cost;
    absl::StrAppendFormat(&out, "fit %u %u vit %a %a llm %a %a audio %a %a\n", f.id, f.from_step,
                          c.vit_linear, c.vit_quadratic, c.llm_linear, c.llm_quadratic,
                          c.audio_linear, c.audio_quadratic);
  }
  return out;
}

absl::StatusOr<CostFitRecordData> ParseCostFitRecord(const std::string& text,
                                                     const std::string& origin,
                                                     const std::string& fingerprint) {
  CostFitRecordData d;
  RETURN_IF_ERROR(ParseStepRecord(
      kCostFitRecord, text, origin, fingerprint, &d.fingerprint, &d.planned_through,
      [&](absl::Span<const absl::string_view> w,
          absl::FunctionRef<absl::Status(absl::string_view)> bad) -> absl::Status {
        if (!(w[0] == "fit" && w.size() == 12 && w[3] == "vit" && w[6] == "llm" &&
              w[9] == "audio")) {
          return bad("not a line of a cost fit record");
        }
        CostFitEntry f;
        CostModelOptions& c = f.cost;
        if (!absl::SimpleAtoi(w[1], &f.id) || !absl::SimpleAtoi(w[2], &f.from_step) ||
            !ParseHexDouble(w[4], &c.vit_linear) || !ParseHexDouble(w[5], &c.vit_quadratic) ||
            !ParseHexDouble(w[7], &c.llm_linear) || !ParseHexDouble(w[8], &c.llm_quadratic) ||
            !ParseHexDouble(w[10], &c.audio_linear) || !ParseHexDouble(w[11], &c.audio_quadratic)) {
          return bad("a fit's id, step or constants do not read as numbers >= 0");
        }
        if (!d.fits.empty() &&
            (f.id != d.fits.back().id + 1 || f.from_step <= d.fits.back().from_step)) {
          return bad("fits out of order");
        }
        d.fits.push_back(f);
        return absl::OkStatus();
      }));
  return d;
}

absl::StatusOr<CostFitRecordData> ReadCostFitRecord(const std::string& path,
                                                    const std::string& fingerprint) {
  ASSIGN_OR_RETURN(auto text, ReadStepRecordText(path));
  if (!text.second) {
    CostFitRecordData d;
    d.fingerprint = fingerprint;
    return d;
  }
  return ParseCostFitRecord(text.first, path, fingerprint);
}

CostFitRecord::CostFitRecord(std::string path, CostFitRecordData data)
    : file_(kCostFitRecord, std::move(path), std::move(data), &FormatCostFitRecord) {}

absl::Status CostFitRecord::AddFit(const CostFitEntry& fit) {
  return file_.Update([&](CostFitRecordData& d) { d.fits.push_back(fit); });
}

absl::Status CostFitRecord::Reserve(uint64_t planned_through) {
  return file_.Reserve(planned_through);
}

void CostFitRecord::Attach(CostSchedule* schedule, uint64_t chunk) {
  schedule->SetRecord([this](const CostFitEntry& f) { return AddFit(f); },
                      [this](uint64_t through) { return Reserve(through); }, chunk);
}

}  // namespace tutti::packer

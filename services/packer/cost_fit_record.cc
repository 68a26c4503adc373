#include "services/packer/cost_fit_record.h"

#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
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

}  // namespace

std::string FormatCostFitRecord(const CostFitRecordData& d) {
  std::string out =
      "# tutti-packerd's online cost fits (job.proto CostFitConfig): the cost constants steps\n"
      "# are planned with from each fit's from_step; constants as C99 hexadecimal floats.\n";
  absl::StrAppend(&out, "job ", d.fingerprint, "\n");
  absl::StrAppend(&out, "planned_through ", d.planned_through, "\n");
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
  int line_no = 0;
  bool have_job = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat("cost fit record ", origin, " line ", line_no, ": ",
                                              why, " ('", line,
                                              "'); it is written by tutti-packerd "
                                              "--cost_fit_record and not edited by hand"));
    };
    if (w[0] == "job" && w.size() == 2) {
      d.fingerprint = std::string(w[1]);
      have_job = true;
    } else if (w[0] == "planned_through" && w.size() == 2) {
      if (!absl::SimpleAtoi(w[1], &d.planned_through)) return bad("not a step count");
    } else if (w[0] == "fit" && w.size() == 12 && w[3] == "vit" && w[6] == "llm" &&
               w[9] == "audio") {
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
    } else {
      return bad("not a line of a cost fit record");
    }
  }
  if (!have_job) {
    return absl::DataLossError(
        absl::StrCat("cost fit record ", origin, " names no job (no 'job <fingerprint>' line)"));
  }
  if (!fingerprint.empty() && d.fingerprint != fingerprint) {
    return absl::FailedPreconditionError(
        absl::StrCat("cost fit record ", origin, " belongs to the job with config fingerprint ",
                     d.fingerprint, ", not to this one (", fingerprint,
                     "): a record replays only the config it was made with; give this job its own "
                     "--cost_fit_record, or the config that record was made with"));
  }
  return d;
}

absl::StatusOr<CostFitRecordData> ReadCostFitRecord(const std::string& path,
                                                    const std::string& fingerprint) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) {
    CostFitRecordData d;
    d.fingerprint = fingerprint;
    return d;
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseCostFitRecord(text, path, fingerprint);
}

CostFitRecord::CostFitRecord(std::string path, CostFitRecordData data)
    : path_(std::move(path)), data_(std::move(data)) {}

absl::Status CostFitRecord::Write() {
  absl::Status s = WriteFileAtomically(path_, FormatCostFitRecord(data_), 0644);
  return s.ok() ? s : Annotate(s, absl::StrCat("cost fit record ", path_));
}

absl::Status CostFitRecord::AddFit(const CostFitEntry& fit) {
  absl::MutexLock lock(&mu_);
  data_.fits.push_back(fit);
  absl::Status s = Write();
  if (!s.ok()) data_.fits.pop_back();
  return s;
}

absl::Status CostFitRecord::Reserve(uint64_t planned_through) {
  absl::MutexLock lock(&mu_);
  const uint64_t before = data_.planned_through;
  data_.planned_through = std::max(before, planned_through);
  absl::Status s = Write();
  if (!s.ok()) data_.planned_through = before;
  return s;
}

void CostFitRecord::Attach(CostSchedule* schedule, uint64_t chunk) {
  schedule->SetRecord([this](const CostFitEntry& f) { return AddFit(f); },
                      [this](uint64_t through) { return Reserve(through); }, chunk);
}

}  // namespace tutti::packer

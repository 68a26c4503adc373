#include "services/packer/step_record.h"

#include <sys/stat.h>

#include <cerrno>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/status.h"

namespace tutti::packer {

std::string FormatStepRecordHead(absl::string_view comment, absl::string_view fingerprint,
                                 uint64_t planned_through) {
  return absl::StrCat(comment, "job ", fingerprint, "\n", "planned_through ", planned_through,
                      "\n");
}

absl::Status ParseStepRecord(const StepRecordKind& kind, absl::string_view text,
                             absl::string_view origin, absl::string_view want_fingerprint,
                             std::string* fingerprint, uint64_t* planned_through,
                             StepRecordLine line_of_kind) {
  int line_no = 0;
  bool have_job = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat(kind.name, " ", origin, " line ", line_no, ": ", why,
                                              " ('", line, "'); it is written by tutti-packerd ",
                                              kind.flag, " and not edited by hand"));
    };
    if (w[0] == "job" && w.size() == 2) {
      *fingerprint = std::string(w[1]);
      have_job = true;
    } else if (w[0] == "planned_through" && w.size() == 2) {
      if (!absl::SimpleAtoi(w[1], planned_through)) return bad("not a step count");
    } else {
      RETURN_IF_ERROR(line_of_kind(w, bad));
    }
  }
  if (!have_job) {
    return absl::DataLossError(
        absl::StrCat(kind.name, " ", origin, " names no job (no 'job <fingerprint>' line)"));
  }
  if (!want_fingerprint.empty() && *fingerprint != want_fingerprint) {
    return absl::FailedPreconditionError(
        absl::StrCat(kind.name, " ", origin, " belongs to the job with config fingerprint ",
                     *fingerprint, ", not to this one (", want_fingerprint,
                     "): a record replays only the config it was made with; give this job its own ",
                     kind.flag, ", or the config that record was made with"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, bool>> ReadStepRecordText(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT)
    return std::make_pair(std::string(), false);
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return std::make_pair(std::move(text), true);
}

absl::Status WriteStepRecord(const StepRecordKind& kind, const std::string& path,
                             const std::string& text) {
  absl::Status s = WriteFileAtomically(path, text, 0644);
  return s.ok() ? s : Annotate(s, absl::StrCat(kind.name, " ", path));
}

}  // namespace tutti::packer

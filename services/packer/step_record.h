// What the packer's step records share (cost_fit_record.h,
// locality_record.h): a small text file, rewritten whole and atomically at
// each change, holding the job it belongs to, how far its steps may have
// been planned, and lines of the record's own kind:
//
//   # comment lines
//   job <config fingerprint>
//   planned_through <steps below this may have been planned>
//   <the record's own lines>
#ifndef TUTTI_SERVICES_PACKER_STEP_RECORD_H_
#define TUTTI_SERVICES_PACKER_STEP_RECORD_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace tutti::packer {

// How a record names itself in messages: "cost fit record" and the flag
// that writes it, "--cost_fit_record".
struct StepRecordKind {
  absl::string_view name;
  absl::string_view flag;
};

// `comment` (whole lines, each starting with '#'), then the job and
// planned_through lines.
std::string FormatStepRecordHead(absl::string_view comment, absl::string_view fingerprint,
                                 uint64_t planned_through);

// A line of the record's own kind, split into words; `bad(why)` is the
// DATA_LOSS status naming the record, the line and `why`.
using StepRecordLine =
    absl::FunctionRef<absl::Status(absl::Span<const absl::string_view> words,
                                   absl::FunctionRef<absl::Status(absl::string_view why)> bad)>;

// Reads `text` (from `origin`): comments and blank lines skipped, the job
// and planned_through lines into `fingerprint` and `planned_through`, every
// other line handed to `line`. DATA_LOSS naming `origin` and the line for
// anything it cannot read, or a record naming no job; FAILED_PRECONDITION
// when the record is another job's (its fingerprint differs from
// `want_fingerprint`; empty: not checked).
absl::Status ParseStepRecord(const StepRecordKind& kind, absl::string_view text,
                             absl::string_view origin, absl::string_view want_fingerprint,
                             std::string* fingerprint, uint64_t* planned_through,
                             StepRecordLine line);

// The text of the record at `path`, or an empty string and false when no
// file is there yet (a new job).
absl::StatusOr<std::pair<std::string, bool>> ReadStepRecordText(const std::string& path);

// The record of a running packer, `Data` with `fingerprint` and
// `planned_through` members, kept on disk as `format` writes it.
template <typename Data>
class StepRecordFile {
 public:
  StepRecordFile(StepRecordKind kind, std::string path, Data data,
                 std::string (*format)(const Data&))
      : kind_(kind), path_(std::move(path)), format_(format), data_(std::move(data)) {}

  // Applies `change` and rewrites the file; when it cannot be written the
  // record is as before and the error names the file.
  absl::Status Update(absl::FunctionRef<void(Data&)> change) {
    absl::MutexLock lock(&mu_);
    Data next = data_;
    change(next);
    if (absl::Status s = Write(format_(next)); !s.ok()) return s;
    data_ = std::move(next);
    return absl::OkStatus();
  }
  // Steps below `planned_through` may have been planned (never lowered).
  absl::Status Reserve(uint64_t planned_through) {
    return Update(
        [&](Data& d) { d.planned_through = std::max(d.planned_through, planned_through); });
  }

 private:
  absl::Status Write(const std::string& text) const;

  const StepRecordKind kind_;
  const std::string path_;
  std::string (*const format_)(const Data&);
  absl::Mutex mu_;
  Data data_ ABSL_GUARDED_BY(mu_);
};

// Writes `text` to `path` atomically; an error names the record.
absl::Status WriteStepRecord(const StepRecordKind& kind, const std::string& path,
                             const std::string& text);

template <typename Data>
absl::Status StepRecordFile<Data>::Write(const std::string& text) const {
  return WriteStepRecord(kind_, path_, text);
}

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_STEP_RECORD_H_

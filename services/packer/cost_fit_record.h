// The record of a job's online cost fits (tutti-packerd --cost_fit_record):
// every fit the packer announced and how far its steps may have been
// planned, so that a restarted packer, `tutti plan --cost-fits` and
// `tutti simulate` plan every step with the constants it was first planned
// with (cost_schedule.h).
//
// A step record (step_record.h), rewritten at each change (a fit, or the
// planning reservation moving on by a chunk of steps), whose own lines are
//
//   fit <id> <from_step> vit <linear> <quadratic> llm <...> <...> audio <...> <...>
//
// Constants are C99 hexadecimal floats (%a), read back bit for bit.
#ifndef TUTTI_SERVICES_PACKER_COST_FIT_RECORD_H_
#define TUTTI_SERVICES_PACKER_COST_FIT_RECORD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/core/cost_schedule.h"
#include "services/packer/step_record.h"

namespace tutti::packer {

struct CostFitRecordData {
  std::string fingerprint;
  uint64_t planned_through = 0;
  std::vector<CostFitEntry> fits;
};

std::string FormatCostFitRecord(const CostFitRecordData& data);
// DATA_LOSS naming `origin` and the line for anything it cannot read;
// FAILED_PRECONDITION when the record is another job's (its fingerprint
// differs from `fingerprint`; empty: not checked).
absl::StatusOr<CostFitRecordData> ParseCostFitRecord(const std::string& text,
                                                     const std::string& origin,
                                                     const std::string& fingerprint);
// The record at `path`; one that does not exist yet is empty (a new job).
absl::StatusOr<CostFitRecordData> ReadCostFitRecord(const std::string& path,
                                                    const std::string& fingerprint);

// The record of a running packer: keeps it on disk as the schedule changes.
class CostFitRecord {
 public:
  CostFitRecord(std::string path, CostFitRecordData data);

  absl::Status AddFit(const CostFitEntry& fit);
  absl::Status Reserve(uint64_t planned_through);

  // Sets `schedule`'s hooks to this record (reserving `chunk` steps ahead at
  // a time). The record must outlive the schedule's use.
  void Attach(CostSchedule* schedule, uint64_t chunk);

 private:
  StepRecordFile<CostFitRecordData> file_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_COST_FIT_RECORD_H_

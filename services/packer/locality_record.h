// The record of the node changes a packer announced with locality
// (tutti-packerd --locality_record): every change (a node removed as dead,
// added back, given a smaller capacity) and how far steps may have been
// planned, so that a restarted packer plans every step with the homes it
// was first planned with (locality_schedule.h). Changes given by the
// operator (--node_removals) are not recorded: they are given again.
//
// A step record (step_record.h), rewritten at each change (an
// announcement, or the planning reservation moving on by a chunk of steps),
// whose own lines are
//
//   remove <node> <from_step>
//   add <node> <from_step>
//   capacity <node> <from_step> <bytes>
//
// Changes in the order they were announced.
#ifndef TUTTI_SERVICES_PACKER_LOCALITY_RECORD_H_
#define TUTTI_SERVICES_PACKER_LOCALITY_RECORD_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/packer/core/home_staging.h"
#include "services/packer/core/locality_schedule.h"
#include "services/packer/step_record.h"

namespace tutti::packer {

struct LocalityRecordData {
  std::string fingerprint;
  uint64_t planned_through = 0;
  std::vector<LocalityChange> changes;
};

std::string FormatLocalityRecord(const LocalityRecordData& data);
// DATA_LOSS naming `origin` and the line for anything it cannot read;
// FAILED_PRECONDITION when the record is another job's (its fingerprint
// differs from `fingerprint`; empty: not checked).
absl::StatusOr<LocalityRecordData> ParseLocalityRecord(const std::string& text,
                                                       const std::string& origin,
                                                       const std::string& fingerprint);
// The record at `path`; one that does not exist yet is empty (a new job).
absl::StatusOr<LocalityRecordData> ReadLocalityRecord(const std::string& path,
                                                      const std::string& fingerprint);

// The homes a packer given `removals` (--node_removals) and the record at
// `path` plans with: the removals first, then the record's changes in the
// order recorded, steps below its planned_through taken as planned. The
// one way tutti-packerd and `tutti plan --locality-record` build it, so the
// two plan every step alike. Errors: the record's (another job's:
// FAILED_PRECONDITION naming both fingerprints), and the schedule's
// (LocalitySchedule::Create) annotated with `path`.
struct LocalityReplay {
  LocalityRecordData data;
  std::unique_ptr<LocalitySchedule> schedule;
};
absl::StatusOr<LocalityReplay> LoadLocalityReplay(std::shared_ptr<const Job> job,
                                                  const std::vector<NodeRemoval>& removals,
                                                  const std::string& path);

// The record of a running packer: keeps it on disk as the schedule changes.
class LocalityRecord {
 public:
  LocalityRecord(std::string path, LocalityRecordData data);

  absl::Status AddChanges(const std::vector<LocalityChange>& changes);
  absl::Status Reserve(uint64_t planned_through);

  // Sets `schedule`'s hooks to this record (reserving `chunk` steps ahead at
  // a time). The record must outlive the schedule's use.
  void Attach(LocalitySchedule* schedule, uint64_t chunk);

 private:
  StepRecordFile<LocalityRecordData> file_;
};

}  // namespace tutti::packer

#endif  // TUTTI_SERVICES_PACKER_LOCALITY_RECORD_H_

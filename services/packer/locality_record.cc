#include "services/packer/locality_record.h"

#include <sys/stat.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_io.h"
#include "common/status.h"

namespace tutti::packer {

std::string FormatLocalityRecord(const LocalityRecordData& d) {
  std::string out =
      "# tutti-packerd's node changes with locality: each in force from its step (remove: the\n"
      "# node holds nothing; add: it is a home again; capacity: it holds at most these bytes).\n";
  absl::StrAppend(&out, "job ", d.fingerprint, "\n");
  absl::StrAppend(&out, "planned_through ", d.planned_through, "\n");
  for (const LocalityChange& c : d.changes) {
    absl::StrAppend(&out, LocalityChangeName(c.kind), " ", c.node, " ", c.from_step);
    if (c.kind == LocalityChange::Kind::kCapacity) absl::StrAppend(&out, " ", c.capacity_bytes);
    absl::StrAppend(&out, "\n");
  }
  return out;
}

absl::StatusOr<LocalityRecordData> ParseLocalityRecord(const std::string& text,
                                                       const std::string& origin,
                                                       const std::string& fingerprint) {
  LocalityRecordData d;
  int line_no = 0;
  bool have_job = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    auto bad = [&](absl::string_view why) {
      return absl::DataLossError(absl::StrCat("locality record ", origin, " line ", line_no, ": ",
                                              why, " ('", line,
                                              "'); it is written by tutti-packerd "
                                              "--locality_record and not edited by hand"));
    };
    if (w[0] == "job" && w.size() == 2) {
      d.fingerprint = std::string(w[1]);
      have_job = true;
    } else if (w[0] == "planned_through" && w.size() == 2) {
      if (!absl::SimpleAtoi(w[1], &d.planned_through)) return bad("not a step count");
    } else if (((w[0] == "remove" || w[0] == "add") && w.size() == 3) ||
               (w[0] == "capacity" && w.size() == 4)) {
      LocalityChange c;
      c.kind = w[0] == "remove" ? LocalityChange::Kind::kRemove
               : w[0] == "add"  ? LocalityChange::Kind::kAdd
                                : LocalityChange::Kind::kCapacity;
      if (!absl::SimpleAtoi(w[1], &c.node) || !absl::SimpleAtoi(w[2], &c.from_step) ||
          (w.size() == 4 && !absl::SimpleAtoi(w[3], &c.capacity_bytes))) {
        return bad("a node, step or byte count does not read as a number");
      }
      d.changes.push_back(c);
    } else {
      return bad("not a line of a locality record");
    }
  }
  if (!have_job) {
    return absl::DataLossError(
        absl::StrCat("locality record ", origin, " names no job (no 'job <fingerprint>' line)"));
  }
  if (!fingerprint.empty() && d.fingerprint != fingerprint) {
    return absl::FailedPreconditionError(
        absl::StrCat("locality record ", origin, " belongs to the job with config fingerprint ",
                     d.fingerprint, ", not to this one (", fingerprint,
                     "): a record replays only the config it was made with; give this job its own "
                     "--locality_record, or the config that record was made with"));
  }
  return d;
}

absl::StatusOr<LocalityRecordData> ReadLocalityRecord(const std::string& path,
                                                      const std::string& fingerprint) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) {
    LocalityRecordData d;
    d.fingerprint = fingerprint;
    return d;
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseLocalityRecord(text, path, fingerprint);
}

absl::StatusOr<LocalityReplay> LoadLocalityReplay(std::shared_ptr<const Job> job,
                                                  const std::vector<NodeRemoval>& removals,
                                                  const std::string& path) {
  LocalityReplay out;
  ASSIGN_OR_RETURN(out.data, ReadLocalityRecord(path, job->fingerprint()));
  std::vector<LocalityChange> changes = RemovalChanges(removals);
  changes.insert(changes.end(), out.data.changes.begin(), out.data.changes.end());
  absl::StatusOr<std::unique_ptr<LocalitySchedule>> schedule =
      LocalitySchedule::Create(std::move(job), std::move(changes), out.data.planned_through);
  if (!schedule.ok()) {
    return Annotate(schedule.status(),
                    absl::StrCat("the node changes of the locality record ", path));
  }
  out.schedule = *std::move(schedule);
  return out;
}

LocalityRecord::LocalityRecord(std::string path, LocalityRecordData data)
    : path_(std::move(path)), data_(std::move(data)) {}

absl::Status LocalityRecord::Write() {
  absl::Status s = WriteFileAtomically(path_, FormatLocalityRecord(data_), 0644);
  return s.ok() ? s : Annotate(s, absl::StrCat("locality record ", path_));
}

absl::Status LocalityRecord::AddChanges(const std::vector<LocalityChange>& changes) {
  absl::MutexLock lock(&mu_);
  const size_t before = data_.changes.size();
  data_.changes.insert(data_.changes.end(), changes.begin(), changes.end());
  absl::Status s = Write();
  if (!s.ok()) data_.changes.resize(before);
  return s;
}

absl::Status LocalityRecord::Reserve(uint64_t planned_through) {
  absl::MutexLock lock(&mu_);
  const uint64_t before = data_.planned_through;
  data_.planned_through = std::max(before, planned_through);
  absl::Status s = Write();
  if (!s.ok()) data_.planned_through = before;
  return s;
}

void LocalityRecord::Attach(LocalitySchedule* schedule, uint64_t chunk) {
  schedule->SetRecord([this](const std::vector<LocalityChange>& c) { return AddChanges(c); },
                      [this](uint64_t through) { return Reserve(through); }, chunk);
}

}  // namespace tutti::packer

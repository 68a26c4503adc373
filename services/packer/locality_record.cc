#include "services/packer/locality_record.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tutti::packer {

namespace {
constexpr StepRecordKind kLocalityRecord{"locality record", "--locality_record"};
}  // namespace

std::string FormatLocalityRecord(const LocalityRecordData& d) {
  std::string out = FormatStepRecordHead(
      "# tutti-packerd's node changes with locality: each in force from its step (remove: the\n"
      "# node holds nothing; add: it is a home again; capacity: it holds at most these bytes).\n",
      d.fingerprint, d.planned_through);
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
  RETURN_IF_ERROR(ParseStepRecord(
      kLocalityRecord, text, origin, fingerprint, &d.fingerprint, &d.planned_through,
      [&](absl::Span<const absl::string_view> w,
          absl::FunctionRef<absl::Status(absl::string_view)> bad) -> absl::Status {
        if (!(((w[0] == "remove" || w[0] == "add") && w.size() == 3) ||
              (w[0] == "capacity" && w.size() == 4))) {
          return bad("not a line of a locality record");
        }
        LocalityChange c;
        c.kind = w[0] == "remove" ? LocalityChange::Kind::kRemove
                 : w[0] == "add"  ? LocalityChange::Kind::kAdd
                                  : LocalityChange::Kind::kCapacity;
        if (!absl::SimpleAtoi(w[1], &c.node) || !absl::SimpleAtoi(w[2], &c.from_step) ||
            (w.size() == 4 && !absl::SimpleAtoi(w[3], &c.capacity_bytes))) {
          return bad("a node, step or byte count does not read as a number");
        }
        d.changes.push_back(c);
        return absl::OkStatus();
      }));
  return d;
}

absl::StatusOr<LocalityRecordData> ReadLocalityRecord(const std::string& path,
                                                      const std::string& fingerprint) {
  ASSIGN_OR_RETURN(auto text, ReadStepRecordText(path));
  if (!text.second) {
    LocalityRecordData d;
    d.fingerprint = fingerprint;
    return d;
  }
  return ParseLocalityRecord(text.first, path, fingerprint);
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
    : file_(kLocalityRecord, std::move(path), std::move(data), &FormatLocalityRecord) {}

absl::Status LocalityRecord::AddChanges(const std::vector<LocalityChange>& changes) {
  return file_.Update([&](LocalityRecordData& d) {
    d.changes.insert(d.changes.end(), changes.begin(), changes.end());
  });
}

absl::Status LocalityRecord::Reserve(uint64_t planned_through) {
  return file_.Reserve(planned_through);
}

void LocalityRecord::Attach(LocalitySchedule* schedule, uint64_t chunk) {
  schedule->SetRecord([this](const std::vector<LocalityChange>& c) { return AddChanges(c); },
                      [this](uint64_t through) { return Reserve(through); }, chunk);
}

}  // namespace tutti::packer

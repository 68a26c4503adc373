#include "services/packer/load_job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/heap_usage.h"
#include "common/job_config.h"
#include "common/log.h"
#include "common/status.h"
#include "services/packer/combine_index.h"
#include "services/packer/index/index.h"

namespace tutti::packer {

static const Logger kLog("packer.job");

namespace {

// What an operator changes so that samples left out for `why` are planned.
const char* UnservableFix(const std::string& why) {
  if (why == "image_too_large") return "raise vision.max_source_pixels / max_source_side";
  if (why == "too_many_images") return "raise vision.max_images_per_sample or split the sample";
  return "pre-tokenise the text into k.json input_ids";
}

}  // namespace

absl::Status CheckPlaceholderPositions(const Index& index, const std::string& path) {
  const std::string options = index.meta("options");
  if (options.find("placeholder_id=") == std::string::npos ||
      options.find("placeholder_positions=1") != std::string::npos) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "index ", path,
      " was built with placeholder ids (schema-2 samples) by a tutti that did not record where "
      "each placeholder sits, which splitting and truncating interleaved documents needs; "
      "re-run `tutti index --source ",
      index.source_dir(), " --out ", path, "`"));
}

absl::StatusOr<std::shared_ptr<const Job>> LoadJob(const std::string& config_path,
                                                   const std::string& index_override,
                                                   const JobOptions& options,
                                                   const std::function<void(v1::JobConfig*)>& edit,
                                                   LoadJobStats* stats) {
  if (config_path.empty()) {
    return absl::InvalidArgumentError(
        "no job config given; pass --config FILE (a text tutti.v1.JobConfig, see "
        "deploy/examples/job.textproto)");
  }
  ASSIGN_OR_RETURN(v1::JobConfig config, LoadJobConfig(config_path));
  if (edit) edit(&config);
  ApplyJobDefaults(&config);
  if (!index_override.empty()) config.set_index_path(index_override);
  const std::vector<std::string> paths = IndexPathsOf(config);
  if (paths.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job config ", config_path,
                     " has no index_path and no --index was given; build an "
                     "index with `tutti index --source DIR --out FILE` and pass --index FILE"));
  }
  LoadJobStats local;
  LoadJobStats& st = stats ? *stats : local;
  auto t0 = absl::Now();
  std::vector<std::shared_ptr<const Index>> indexes;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::shared_ptr<const Index> one, LoadIndex(path));
    RETURN_IF_ERROR(CheckPlaceholderPositions(*one, path));
    indexes.push_back(std::move(one));
  }
  std::shared_ptr<const Index> index = indexes[0];
  if (indexes.size() > 1) {
    // A mixture over several index files plans from them combined (on the
    // heap: the files' mappings are released once the combined copy exists).
    ASSIGN_OR_RETURN(index, CombineIndexes(indexes, paths));
    kLog.Info("combined the mixture's index files", {{"files", indexes.size()},
                                                     {"samples", index->num_samples()},
                                                     {"source_dir", index->source_dir()}});
  }
  indexes.clear();
  st.index_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  st.samples = index->num_samples();
  st.index_mapped_bytes = index->mapped_bytes();
  st.index_heap_bytes = index->heap_bytes();
  const uint64_t heap0 = HeapInUseBytes();
  t0 = absl::Now();
  auto job = Job::Create(std::move(config), std::move(index), options);
  if (!job.ok()) return Annotate(job.status(), absl::StrCat("job config ", config_path));
  st.job_seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  const uint64_t heap1 = HeapInUseBytes();
  st.job_heap_bytes = heap1 > heap0 ? heap1 - heap0 : 0;
  for (const auto& [why, n] : (*job)->unservable()) {
    kLog.Warning("samples left out of the plans: the stager would refuse them",
                 {{"reason", why},
                  {"samples", n},
                  {"first", (*job)->unservable_examples().at(why)},
                  {"fix", UnservableFix(why)}});
  }
  return job;
}

}  // namespace tutti::packer

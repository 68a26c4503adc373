#include "services/packer/load_job.h"

#include "absl/strings/str_cat.h"
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

absl::StatusOr<std::shared_ptr<const Job>> LoadJob(
    const std::string& config_path, const std::string& index_override, const JobOptions& options,
    const std::function<void(v1::JobConfig*)>& edit) {
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
  std::vector<std::shared_ptr<const Index>> indexes;
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::shared_ptr<const Index> one, LoadIndex(path));
    indexes.push_back(std::move(one));
  }
  std::shared_ptr<const Index> index = indexes[0];
  if (indexes.size() > 1) {
    // A mixture over several index files plans from them combined.
    ASSIGN_OR_RETURN(index, CombineIndexes(indexes, paths));
    kLog.Info("combined the mixture's index files", {{"files", indexes.size()},
                                                     {"samples", index->num_samples()},
                                                     {"source_dir", index->source_dir()}});
  }
  auto job = Job::Create(std::move(config), std::move(index), options);
  if (!job.ok()) return Annotate(job.status(), absl::StrCat("job config ", config_path));
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

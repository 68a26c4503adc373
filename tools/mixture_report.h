// The realised mixture of a range of planned steps, per source against its
// target, per stage of the mixture's schedule: what `tutti plan` (summary)
// and `tutti simulate` print after their steps.
#ifndef TUTTI_TOOLS_MIXTURE_REPORT_H_
#define TUTTI_TOOLS_MIXTURE_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "services/packer/core/job.h"
#include "services/packer/core/plan_data.h"

namespace tutti::tools {

class MixtureReport {
 public:
  explicit MixtureReport(const packer::Job& job);
  // A planned step: its samples by source (a split document once), and what
  // the weights give each source at it.
  void Add(const packer::StepPlanData& step);

  // Per stage (the sources' weights, then each of mixture.stages; a job
  // without a mixture has one) and source: the samples the plans hold, their
  // share of the stream they came from, the weights' share, the samples the
  // steps drew and the drawn count less the target (within one sample
  // since the weights in force began).
  std::string Table() const;
  // The same rows as JSON objects ("stage", "source", "stream", "planned",
  // "share", "target_share", "drawn", "drawn_minus_target"), comma-separated.
  std::string Json() const;

 private:
  struct Row {
    uint64_t planned = 0, drawn = 0;
    double target = 0;
  };
  struct Stage {
    uint64_t first = UINT64_MAX, last = 0;
    std::map<std::pair<int, uint32_t>, Row> rows;  // (stream, source)
    uint64_t planned[2] = {0, 0};
  };
  int StageOf(uint64_t step) const;
  std::string StageName(int stage) const;

  const packer::Job& job_;
  std::map<int, Stage> stages_;
};

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_MIXTURE_REPORT_H_

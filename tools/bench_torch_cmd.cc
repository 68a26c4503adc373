// `tutti bench torch`: tutti.torch's per-step Python cost and its exchange
// over gloo and over the MPI transport, each beside its baseline in one run.
// The benchmark is Python (tutti/torch/bench.py); this runs it with the
// package next to this binary and the Python that has torch ($TUTTI_PYTHON,
// else the configured one; tools/python_module.h), passing every option
// through (--help lists them).
#include <string>
#include <vector>

#include "tools/commands.h"
#include "tools/python_module.h"

namespace {

int RunBenchTorch(int argc, char** argv) {
  return tutti::tools::ExecPythonModule("tutti bench torch", "torch", "tutti.torch.bench",
                                        std::vector<std::string>(argv + 1, argv + argc));
}

}  // namespace

TUTTI_COMMAND("bench torch",
              "time tutti.torch: the Python path per step and its exchange vs bare torch/MPI",
              RunBenchTorch);

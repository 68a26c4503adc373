// `tutti bench torch`: tutti.torch's per-step Python cost and its exchange
// over gloo and over the MPI transport, each beside its baseline in one run.
// The benchmark is Python (tutti/torch/bench.py); this runs it with the
// package next to this binary (the build tree's python/, or an install's
// lib/python) and the Python that has torch ($TUTTI_PYTHON, else
// /usr/bin/python3), passing every option through (--help lists them).
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tools/commands.h"

namespace {

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool IsDir(const std::string& path) { return access((path + "/tutti/torch").c_str(), R_OK) == 0; }

int RunBenchTorch(int argc, char** argv) {
  char self[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string bin = n > 0 ? Dirname(std::string(self, n)) : ".";
  std::string package;
  for (const std::string& candidate : {bin + "/../python", bin + "/../lib/python"}) {
    if (IsDir(candidate)) {
      package = candidate;
      break;
    }
  }
  if (package.empty()) {
    std::fprintf(stderr,
                 "tutti bench torch: the tutti Python package is not next to this binary (%s/../"
                 "python or ../lib/python); build it (ninja tutti_python) or install tutti\n",
                 bin.c_str());
    return 1;
  }
  const char* old = std::getenv("PYTHONPATH");
  const std::string path = old && *old ? package + ":" + old : package;
  setenv("PYTHONPATH", path.c_str(), 1);
  const char* py = std::getenv("TUTTI_PYTHON");
  const std::string python = py && *py ? py : "/usr/bin/python3";
  std::vector<std::string> args = {python, "-m", "tutti.torch.bench"};
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execv(python.c_str(), cargs.data());
  std::perror(("tutti bench torch: cannot run " + python + " (set TUTTI_PYTHON)").c_str());
  return 1;
}

}  // namespace

TUTTI_COMMAND("bench torch",
              "time tutti.torch: the Python path per step and its exchange vs bare torch/MPI",
              RunBenchTorch);

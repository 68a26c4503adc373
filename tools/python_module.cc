#include "tools/python_module.h"

#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>

#ifndef TUTTI_PYTHON_EXECUTABLE
#define TUTTI_PYTHON_EXECUTABLE "/usr/bin/python3"
#endif

namespace tutti::tools {
namespace {

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

int ExecPythonModule(const std::string& command, const std::string& subpackage,
                     const std::string& module, const std::vector<std::string>& args) {
  char self[PATH_MAX] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string bin = n > 0 ? Dirname(std::string(self, n)) : ".";
  std::string package;
  for (const std::string& candidate : {bin + "/../python", bin + "/../lib/python"}) {
    if (access((candidate + "/tutti/" + subpackage).c_str(), R_OK) == 0) {
      package = candidate;
      break;
    }
  }
  if (package.empty()) {
    std::fprintf(stderr,
                 "%s: the tutti Python package is not next to this binary (%s/../python or "
                 "../lib/python); build it (cmake --build build --target tutti_python) or "
                 "install tutti\n",
                 command.c_str(), bin.c_str());
    return 1;
  }
  const char* old = std::getenv("PYTHONPATH");
  const std::string path = old && *old ? package + ":" + old : package;
  setenv("PYTHONPATH", path.c_str(), 1);
  const char* py = std::getenv("TUTTI_PYTHON");
  const std::string python = py && *py ? py : TUTTI_PYTHON_EXECUTABLE;
  std::vector<std::string> argv = {python, "-m", module};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargs;
  for (std::string& a : argv) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execv(python.c_str(), cargs.data());
  std::perror((command + ": cannot run " + python + " (set TUTTI_PYTHON)").c_str());
  return 1;
}

}  // namespace tutti::tools

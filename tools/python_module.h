// Running a module of the tutti Python package from the `tutti` tool
// (`tutti convert`, `tutti bench convert`, `tutti bench torch`): the package
// next to this binary (the build tree's python/, or an install's lib/python),
// on PYTHONPATH ahead of what is there, and the interpreter from $TUTTI_PYTHON,
// else the one the build was configured with, else /usr/bin/python3.
#ifndef TUTTI_TOOLS_PYTHON_MODULE_H_
#define TUTTI_TOOLS_PYTHON_MODULE_H_

#include <string>
#include <vector>

namespace tutti::tools {

// Replaces this process with `python -m module args...`. `subpackage` (e.g.
// "convert") must be in the package found. Returns only on failure, with 1,
// after printing what went wrong prefixed by `command`.
int ExecPythonModule(const std::string& command, const std::string& subpackage,
                     const std::string& module, const std::vector<std::string>& args);

}  // namespace tutti::tools

#endif  // TUTTI_TOOLS_PYTHON_MODULE_H_

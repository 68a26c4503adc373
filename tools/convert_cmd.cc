// `tutti convert` and `tutti bench convert`: the converter from conversation and
// caption records to tutti shards is Python (tokenizers live there:
// tutti/convert); these run it, passing every option through (--help lists them).
#include <string>
#include <vector>

#include "tools/commands.h"
#include "tools/python_module.h"

namespace {

std::vector<std::string> Args(int argc, char** argv) { return {argv + 1, argv + argc}; }

int RunConvert(int argc, char** argv) {
  return tutti::tools::ExecPythonModule("tutti convert", "convert", "tutti.convert",
                                        Args(argc, argv));
}

int RunBenchConvert(int argc, char** argv) {
  return tutti::tools::ExecPythonModule("tutti bench convert", "convert", "tutti.convert.bench",
                                        Args(argc, argv));
}

}  // namespace

TUTTI_COMMAND("convert",
              "conversation and caption records -> tutti shards (chat template, tokenizer)",
              RunConvert);
TUTTI_COMMAND("bench convert",
              "time tutti convert per core and over cores against the tokenizer alone",
              RunBenchConvert);

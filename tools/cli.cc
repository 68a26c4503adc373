#include "tools/cli.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tutti::tools {
namespace {

std::string Show(const std::string* v) { return v->empty() ? "\"\"" : *v; }
std::string Show(const int64_t* v) { return absl::StrCat(*v); }
std::string Show(const uint64_t* v) { return absl::StrCat(*v); }
std::string Show(const uint32_t* v) { return absl::StrCat(*v); }
std::string Show(const double* v) { return absl::StrCat(*v); }
std::string Show(const bool* v) { return *v ? "true" : "false"; }

}  // namespace

Cli::Cli(std::string usage, std::string description)
    : usage_(std::move(usage)), description_(std::move(description)) {}

#define TUTTI_CLI_FLAG(T)                                                           \
  void Cli::Flag(const std::string& name, T* value, const std::string& help) {      \
    options_.push_back(Option{name, value, help, Show(value)});                     \
  }
TUTTI_CLI_FLAG(std::string)
TUTTI_CLI_FLAG(int64_t)
TUTTI_CLI_FLAG(uint64_t)
TUTTI_CLI_FLAG(uint32_t)
TUTTI_CLI_FLAG(double)
TUTTI_CLI_FLAG(bool)
#undef TUTTI_CLI_FLAG

void Cli::Flag(const std::string& name, uint64_t* value, const std::string& help, uint64_t lo,
               uint64_t hi) {
  options_.push_back(Option{name, value, help, Show(value), true, lo, hi});
}
void Cli::Flag(const std::string& name, uint32_t* value, const std::string& help, uint32_t lo,
               uint32_t hi) {
  options_.push_back(Option{name, value, help, Show(value), true, lo, hi});
}

bool Cli::Set(Option& opt, const std::string& value, std::string* error) {
  bool ok = std::visit(
      [&](auto* p) -> bool {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) {
          *p = value;
          return true;
        } else if constexpr (std::is_same_v<T, bool>) {
          if (value == "true" || value == "1" || value.empty()) *p = true;
          else if (value == "false" || value == "0") *p = false;
          else return false;
          return true;
        } else if constexpr (std::is_same_v<T, double>) {
          return absl::SimpleAtod(value, p);
        } else {
          return absl::SimpleAtoi(value, p);
        }
      },
      opt.target);
  if (!ok) {
    *error = absl::StrCat("--", opt.name, ": cannot use '", value, "' (default is ",
                          opt.default_text, ")");
    return false;
  }
  if (opt.ranged) {
    const uint64_t v = std::visit(
        [](auto* p) -> uint64_t {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, uint64_t> || std::is_same_v<T, uint32_t>) return *p;
          return 0;
        },
        opt.target);
    if (v < opt.lo || v > opt.hi) {
      *error = absl::StrCat("--", opt.name, " ", value, " is out of range: use ", opt.lo, "..",
                            opt.hi);
      return false;
    }
  }
  return true;
}

bool Cli::Parse(int argc, char** argv, int* exit_code) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || arg == "--help" || arg == "help") {
      PrintHelp();
      *exit_code = 0;
      return false;
    }
    if (arg.rfind("--", 0) != 0) {
      positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    Option* opt = nullptr;
    bool negated = false;
    for (auto& o : options_) {
      if (o.name == name) opt = &o;
      if (!opt && std::holds_alternative<bool*>(o.target) && name == "no" + o.name) {
        opt = &o;
        negated = true;
      }
    }
    if (opt == nullptr) {
      std::fprintf(stderr, "%s: unknown option --%s\nRun with --help for the options.\n",
                   usage_.c_str(), name.c_str());
      *exit_code = 2;
      return false;
    }
    if (std::holds_alternative<bool*>(opt->target)) {
      if (negated) value = "false";
    } else if (!has_value) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "--%s needs a value\n", name.c_str());
        *exit_code = 2;
        return false;
      }
      value = argv[++i];
    }
    std::string error;
    if (!Set(*opt, value, &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      *exit_code = 2;
      return false;
    }
  }
  return true;
}

void Cli::PrintHelp() const {
  std::printf("usage: %s\n\n%s\n\noptions:\n", usage_.c_str(), description_.c_str());
  for (const auto& o : options_) {
    const std::string range = o.ranged ? absl::StrCat("; ", o.lo, "..", o.hi) : "";
    std::printf("  --%-24s %s (default: %s%s)\n", o.name.c_str(), o.help.c_str(),
                o.default_text.c_str(), range.c_str());
  }
  std::printf("  --%-24s %s\n", "help", "show this help");
}

}  // namespace tutti::tools

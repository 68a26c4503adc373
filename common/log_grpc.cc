#include "common/log_grpc.h"

#include <grpc/support/log.h>

#include "absl/strings/string_view.h"
#include "common/log.h"

namespace tutti {
namespace {

void ToTuttiLog(gpr_log_func_args* args) {
  LogLevel level = LogLevel::kInfo;
  switch (args->severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      level = LogLevel::kDebug;
      break;
    case GPR_LOG_SEVERITY_INFO:
      level = LogLevel::kInfo;
      break;
    case GPR_LOG_SEVERITY_ERROR:
      level = LogLevel::kError;
      break;
  }
  absl::string_view file = args->file != nullptr ? args->file : "";
  if (const size_t slash = file.rfind('/'); slash != absl::string_view::npos) {
    file.remove_prefix(slash + 1);
  }
  LogLine(level, "grpc", args->message != nullptr ? args->message : "",
          {{"src", file}, {"line", args->line}});
}

}  // namespace

void RouteGrpcLogging() { gpr_set_log_function(&ToTuttiLog); }

}  // namespace tutti

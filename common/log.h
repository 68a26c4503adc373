// One structured log line format for every tutti process.
//
//   text: 2026-12-01T09:30:00.123456Z INFO  stager.staging staged shard shard=a.tar bytes=41943040
//   json: {"ts":"2026-12-01T09:30:00.123456Z","level":"info","component":"stager.staging",
//          "msg":"staged shard","shard":"a.tar","bytes":"41943040"}
//
// Each logic class keeps a `Logger` named after its component; the daemon's
// main calls `ConfigureLogging` once from its flags. Lines go to stderr, each
// with one write(2), so lines of concurrent threads never interleave. Every
// function here is safe to call from any thread.
#ifndef TUTTI_COMMON_LOG_H_
#define TUTTI_COMMON_LOG_H_

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tutti {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };
enum class LogFormat { kText, kJson };

struct LogOptions {
  // Lines below this level are dropped.
  LogLevel min_level = LogLevel::kInfo;
  // kText: "<timestamp> <LEVEL> <component> <message> key=value ..."; kJson: one object.
  LogFormat format = LogFormat::kText;
};

// Sets the process-wide options (normally once, in main, before threads start).
void ConfigureLogging(const LogOptions& options);
LogOptions CurrentLogOptions();

// "debug" | "info" | "warning" | "error" (also "warn"), and "text" | "json";
// errors name the value and the accepted ones.
absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name);
absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name);
absl::string_view LogLevelName(LogLevel level);

// One key=value pair of a log line; the value is anything absl::StrCat takes.
struct LogField {
  LogField(absl::string_view k, const absl::AlphaNum& v) : key(k), value(v.Piece()) {}
  absl::string_view key;
  std::string value;
};
using LogFields = std::initializer_list<LogField>;

// Formats one line (without writing it); exposed for tests.
std::string FormatLogLine(absl::Time when, LogLevel level, absl::string_view component,
                          absl::string_view message, LogFields fields, LogFormat format);

// Writes one line if `level` passes the configured minimum.
void LogLine(LogLevel level, absl::string_view component, absl::string_view message,
             LogFields fields = {});

// A component's logger: `static const Logger kLog("stager.staging");`.
class Logger {
 public:
  constexpr explicit Logger(absl::string_view component) : component_(component) {}

  void Debug(absl::string_view message, LogFields fields = {}) const {
    LogLine(LogLevel::kDebug, component_, message, fields);
  }
  void Info(absl::string_view message, LogFields fields = {}) const {
    LogLine(LogLevel::kInfo, component_, message, fields);
  }
  void Warning(absl::string_view message, LogFields fields = {}) const {
    LogLine(LogLevel::kWarning, component_, message, fields);
  }
  void Error(absl::string_view message, LogFields fields = {}) const {
    LogLine(LogLevel::kError, component_, message, fields);
  }
  absl::string_view component() const { return component_; }

 private:
  absl::string_view component_;
};

// Lets through at most `burst` lines per `period` from one call site and
// counts the rest; the next line let through carries `suppressed=N`.
//
//   static LogRateLimit limit(absl::Seconds(10), 5);
//   if (uint64_t dropped; limit.Allow(&dropped)) kLog.Warning("...", {{"suppressed", dropped}});
class LogRateLimit {
 public:
  LogRateLimit(absl::Duration period, int burst);
  // True when this line may be written; *suppressed gets how many were held
  // back since the last line that was let through.
  bool Allow(uint64_t* suppressed);

 private:
  const int64_t period_ns_;
  const int burst_;
  std::atomic<int64_t> window_start_ns_{0};
  std::atomic<int> in_window_{0};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace tutti

#endif  // TUTTI_COMMON_LOG_H_

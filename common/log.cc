#include "common/log.h"

#include <unistd.h>

#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace tutti {
namespace {

std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<int> g_format{static_cast<int>(LogFormat::kText)};

// A text value is written bare when it has no space, quote, '=' or control
// character; otherwise quoted with JSON escapes, so a line always splits
// unambiguously into key=value pairs.
bool NeedsQuotes(absl::string_view v) {
  if (v.empty()) return true;
  for (unsigned char c : v) {
    if (c <= ' ' || c == '"' || c == '=' || c == 0x7f) return true;
  }
  return false;
}

void AppendJsonString(std::string* out, absl::string_view v) {
  out->push_back('"');
  for (unsigned char c : v) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void AppendTextValue(std::string* out, absl::string_view v) {
  if (NeedsQuotes(v)) {
    AppendJsonString(out, v);
  } else {
    out->append(v.data(), v.size());
  }
}

}  // namespace

void ConfigureLogging(const LogOptions& options) {
  g_min_level.store(static_cast<int>(options.min_level), std::memory_order_relaxed);
  g_format.store(static_cast<int>(options.format), std::memory_order_relaxed);
}

LogOptions CurrentLogOptions() {
  LogOptions options;
  options.min_level = static_cast<LogLevel>(g_min_level.load(std::memory_order_relaxed));
  options.format = static_cast<LogFormat>(g_format.load(std::memory_order_relaxed));
  return options;
}

absl::StatusOr<LogLevel> ParseLogLevel(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "debug") return LogLevel::kDebug;
  if (n == "info") return LogLevel::kInfo;
  if (n == "warning" || n == "warn") return LogLevel::kWarning;
  if (n == "error") return LogLevel::kError;
  return absl::InvalidArgumentError(
      absl::StrCat("log level '", name, "' is not one of debug, info, warning, error"));
}

absl::StatusOr<LogFormat> ParseLogFormat(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "text") return LogFormat::kText;
  if (n == "json") return LogFormat::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("log format '", name, "' is not one of text, json"));
}

absl::string_view LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "info";
}

std::string FormatLogLine(absl::Time when, LogLevel level, absl::string_view component,
                          absl::string_view message, LogFields fields, LogFormat format) {
  const std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", when, absl::UTCTimeZone());
  std::string line;
  line.reserve(96 + message.size());
  if (format == LogFormat::kJson) {
    absl::StrAppend(&line, "{\"ts\":\"", ts, "\",\"level\":\"", LogLevelName(level),
                    "\",\"component\":");
    AppendJsonString(&line, component);
    line.append(",\"msg\":");
    AppendJsonString(&line, message);
    for (const LogField& f : fields) {
      line.push_back(',');
      AppendJsonString(&line, f.key);
      line.push_back(':');
      AppendJsonString(&line, f.value);
    }
    line.append("}\n");
    return line;
  }
  std::string lvl = absl::AsciiStrToUpper(LogLevelName(level));
  if (level == LogLevel::kWarning) lvl = "WARN";
  absl::StrAppendFormat(&line, "%s %-5s %s ", ts, lvl, component);
  // The message is free text; only its line breaks are escaped.
  for (char c : message) {
    if (c == '\n') {
      line.append("\\n");
    } else {
      line.push_back(c);
    }
  }
  for (const LogField& f : fields) {
    line.push_back(' ');
    line.append(f.key.data(), f.key.size());
    line.push_back('=');
    AppendTextValue(&line, f.value);
  }
  line.push_back('\n');
  return line;
}

void LogLine(LogLevel level, absl::string_view component, absl::string_view message,
             LogFields fields) {
  if (static_cast<int>(level) < g_min_level.load(std::memory_order_relaxed)) return;
  const std::string line =
      FormatLogLine(absl::Now(), level, component, message, fields,
                    static_cast<LogFormat>(g_format.load(std::memory_order_relaxed)));
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone; nothing better to do with a log line
    done += static_cast<size_t>(n);
  }
}

LogRateLimit::LogRateLimit(absl::Duration period, int burst)
    : period_ns_(absl::ToInt64Nanoseconds(period)), burst_(burst) {}

bool LogRateLimit::Allow(uint64_t* suppressed) {
  const int64_t now = absl::GetCurrentTimeNanos();
  int64_t start = window_start_ns_.load(std::memory_order_relaxed);
  if (now - start >= period_ns_ &&
      window_start_ns_.compare_exchange_strong(start, now, std::memory_order_relaxed)) {
    in_window_.store(0, std::memory_order_relaxed);
  }
  if (in_window_.fetch_add(1, std::memory_order_relaxed) < burst_) {
    *suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  *suppressed = 0;
  return false;
}

}  // namespace tutti

#include "common/metrics_server.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include "absl/strings/str_cat.h"

namespace tutti {

HttpResponse MetricsServer::Answer(const MetricsEndpoints& endpoints, absl::string_view path) {
  HttpResponse r;
  if (path == "/metrics") {
    std::vector<prometheus::MetricFamily> families;
    for (const auto& c : endpoints.collectables) {
      auto f = c->Collect();
      families.insert(families.end(), std::make_move_iterator(f.begin()),
                      std::make_move_iterator(f.end()));
    }
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = prometheus::TextSerializer().Serialize(families);
    return r;
  }
  const bool health = path == "/healthz";
  if (health || path == "/readyz") {
    const auto& check = health ? endpoints.live : endpoints.ready;
    const absl::Status s = check ? check() : absl::OkStatus();
    if (s.ok()) {
      r.body = health ? "ok\n" : "ready\n";
    } else {
      r.status = 503;
      std::string why(s.message());
      for (char& c : why) {
        if (c == '\n') c = ' ';
      }
      r.body = absl::StrCat(health ? "not ok: " : "not ready: ", why, "\n");
    }
    return r;
  }
  r.status = 404;
  r.body = "not found: try /metrics, /healthz or /readyz\n";
  return r;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    MetricsEndpoints endpoints) {
  auto shared = std::make_shared<MetricsEndpoints>(std::move(endpoints));
  auto http = HttpServer::Start(
      address, [shared](absl::string_view path) { return Answer(*shared, path); }, "--metrics");
  if (!http.ok()) return http.status();
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(*http)));
}

}  // namespace tutti

// tutti-packerd: one per job; serves step plans over gRPC (tutti.v1.Packer).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/daemon_flags.h"
#include "common/metrics_server.h"
#include "services/packer/packer_server.h"

ABSL_FLAG(std::string, config, "",
          "job config: a text-format tutti.v1.JobConfig (see deploy/examples/job.textproto); "
          "required");
ABSL_FLAG(std::string, index, "",
          "index file written by `tutti index`; overrides the config's index_path");
ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "gRPC address HOST:PORT to serve tutti.v1.Packer on; port 0 picks a free port");
ABSL_FLAG(std::string, metrics, "127.0.0.1:9470",
          "HOST:PORT serving Prometheus /metrics; port 0 picks a free port");
ABSL_FLAG(std::string, port_file, "",
          "if set, write the bound ports here as 'grpc=PORT\\nmetrics=PORT\\n' once serving");
ABSL_FLAG(uint32_t, plan_threads, 2, "threads planning steps ahead of the clients");

int main(int argc, char** argv) {
  tutti::ParseFlags(
      argc, argv,
      "serves per-step plans for one training job.\n"
      "usage: tutti-packerd --config JOB.textproto [--index FILE] [--listen HOST:PORT]\n"
      "Stops cleanly (exit 0) on SIGTERM or SIGINT.",
      "services/packer/main.cc");
  tutti::packer::BlockTerminationSignals();
  auto registry = std::make_shared<prometheus::Registry>();
  tutti::packer::PackerServerOptions o;
  o.config_path = absl::GetFlag(FLAGS_config);
  o.index_path = absl::GetFlag(FLAGS_index);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  o.metrics_address = absl::GetFlag(FLAGS_metrics);
  o.plan_threads = absl::GetFlag(FLAGS_plan_threads);
  auto exposer = tutti::StartMetricsServer(o.metrics_address, registry, &o.metrics_port);
  auto server = exposer.ok()
                    ? tutti::packer::PackerServer::Start(o, registry)
                    : decltype(tutti::packer::PackerServer::Start(o, registry))(exposer.status());
  if (!server.ok()) {
    std::fprintf(stderr, "tutti-packerd: %s\n", std::string(server.status().message()).c_str());
    std::fflush(stderr);
    std::_Exit(1);  // nothing to clean up; skips the metrics server's slow stop
  }
  std::printf("%s\n", (*server)->Banner().c_str());
  std::fflush(stdout);
  const int sig = tutti::packer::WaitForTerminationSignal();
  std::fprintf(stderr, "tutti-packerd: signal %d, shutting down\n", sig);
  (*server)->Shutdown();
  return 0;
}

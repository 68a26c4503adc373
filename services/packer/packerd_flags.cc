#include "services/packer/packerd_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/daemon_flags.h"
#include "common/security_flags.h"
#include "common/status.h"
#include "services/packer/core/home_staging.h"

ABSL_FLAG(std::string, config, "",
          "job config: a text-format tutti.v1.JobConfig (see deploy/examples/job.textproto); "
          "required");
ABSL_FLAG(std::string, index, "",
          "index file written by `tutti index`; overrides the config's index_path");
ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "gRPC address HOST:PORT to serve tutti.v1.Packer on; port 0 picks a free port");
ABSL_FLAG(std::string, metrics, "127.0.0.1:9470",
          "HOST:PORT serving /metrics, /healthz and /readyz; port 0 picks a free port");
ABSL_FLAG(std::string, port_file, "",
          "if set, write 'metrics=PORT\\n' here at once (probes may start), then "
          "'grpc=PORT\\nmetrics=PORT\\ngrpc_address=ADDRESS\\n' once serving, before /readyz "
          "first says ready");
ABSL_FLAG(uint32_t, plan_threads, 2, "threads planning steps ahead of the clients, 1..256");
ABSL_FLAG(uint32_t, max_streams_per_client, tutti::packer::kDefaultMaxStreamsPerClient,
          "StreamPlans calls one client connection may hold open at once, 1..65536; one more "
          "is RESOURCE_EXHAUSTED");
ABSL_FLAG(std::string, served_plan_cache, "256M",
          "serialized plans kept to serve the same step and ranks again without building "
          "them, 0 or 1M to 64G (0 = keep none); the plans of the steps within the plan window "
          "of the newest one asked for");
ABSL_FLAG(std::string, served_plan_precompute, "nodes,ranks",
          "rank sets whose serialized plans are built when a step is planned, before any "
          "client asks (so a job's first requests after a start are served at once), within "
          "--served_plan_cache: 'nodes' (each node's ranks, as a stager asks), 'ranks' (each "
          "rank alone), both comma-separated, or 'none'");
ABSL_FLAG(std::string, cost_fit_record, "",
          "file recording the job's online cost fits (job config cost.online_fit), read at "
          "start so that a restarted packer plans every step as before, and rewritten as fits "
          "are announced; required when the fit is enabled (one file per job, on persistent "
          "storage)");

ABSL_FLAG(std::string, node_removals, "",
          "with locality (job config locality.home_replication): nodes that hold nothing from "
          "a step on, as node@step[,node@step...] (e.g. 5@1200); their shards are re-homed from "
          "that step and earlier steps keep their plans. Announce a step beyond those already "
          "served, and give a restarted packer the same list so that it plans the same steps");

ABSL_FLAG(std::string, locality_record, "",
          "with locality: file recording the node changes the packer announces from the "
          "stagers' reports (a dead node removed, a returning one added back, a full cache "
          "re-homed), read at start so that a restarted packer plans every step as before; "
          "without it the reports are not acted on (one file per job, on persistent storage)");
ABSL_FLAG(int32_t, node_dead_after_s, 30,
          "with locality and --locality_record: a node whose stager reported before and then "
          "not for this many seconds is removed (its shards re-homed from the first step not "
          "yet planned); 0 = never; 1 to 86400");

namespace tutti::packer {

absl::StatusOr<uint32_t> PrecomputeShapesFlag(absl::string_view value) {
  uint32_t shapes = kPrecomputeNone;
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (part == "nodes") {
      shapes |= kPrecomputeNodes;
    } else if (part == "ranks") {
      shapes |= kPrecomputeRanks;
    } else if (part != "none" || value != "none") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--served_plan_precompute=", value, ": '", part,
          "' is not a rank set; give 'nodes', 'ranks', 'nodes,ranks' or 'none'"));
    }
  }
  return shapes;
}

absl::StatusOr<PackerServerOptions> PackerOptionsFromFlags() {
  PackerServerOptions o;
  o.config_path = absl::GetFlag(FLAGS_config);
  if (o.config_path.empty()) {
    return absl::InvalidArgumentError(
        "--config is required: a text tutti.v1.JobConfig (see deploy/examples/job.textproto)");
  }
  o.index_path = absl::GetFlag(FLAGS_index);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.metrics = absl::GetFlag(FLAGS_metrics);
  o.port_file = absl::GetFlag(FLAGS_port_file);
  RETURN_IF_ERROR(CheckAddressFlag("listen", o.listen, AddressUse::kServe, true));
  RETURN_IF_ERROR(CheckAddressFlag("metrics", o.metrics, AddressUse::kServe, false));
  o.plan_threads = absl::GetFlag(FLAGS_plan_threads);
  RETURN_IF_ERROR(CheckFlagRange("plan_threads", o.plan_threads, 1, 256));
  o.max_streams_per_client = absl::GetFlag(FLAGS_max_streams_per_client);
  RETURN_IF_ERROR(CheckFlagRange("max_streams_per_client", o.max_streams_per_client, 1, 65536));
  ASSIGN_OR_RETURN(o.served.max_bytes,
                   ByteSizeFlag("served_plan_cache", absl::GetFlag(FLAGS_served_plan_cache),
                                uint64_t{1} << 20, uint64_t{64} << 30, "keep none"));
  ASSIGN_OR_RETURN(o.served.precompute,
                   PrecomputeShapesFlag(absl::GetFlag(FLAGS_served_plan_precompute)));
  ASSIGN_OR_RETURN(o.rpc, RpcGateOptionsFromFlags(o.listen));
  o.cost_fit_record = absl::GetFlag(FLAGS_cost_fit_record);
  ASSIGN_OR_RETURN(o.job.node_removals, ParseNodeRemovals(absl::GetFlag(FLAGS_node_removals)));
  o.locality_record = absl::GetFlag(FLAGS_locality_record);
  const int32_t dead_after = absl::GetFlag(FLAGS_node_dead_after_s);
  RETURN_IF_ERROR(CheckFlagRange("node_dead_after_s", dead_after, 0, 86400));
  o.node_dead_after = absl::Seconds(dead_after);
  return o;
}

DaemonMain PackerdMain() {
  DaemonMain m;
  m.name = "tutti-packerd";
  m.usage =
      "serves per-step plans for one training job.\n"
      "usage: tutti-packerd --config JOB.textproto [--index FILE] [--listen HOST:PORT]\n"
      "Ready (/readyz, gRPC health) once the index is loaded and the first plan computed.";
  m.flag_files = {"services/packer/packerd_flags.cc", "common/security_flags.cc"};
  m.make = []() -> absl::StatusOr<std::unique_ptr<Daemon>> {
    ASSIGN_OR_RETURN(PackerServerOptions o, PackerOptionsFromFlags());
    return std::unique_ptr<Daemon>(std::make_unique<PackerServer>(std::move(o)));
  };
  return m;
}

}  // namespace tutti::packer

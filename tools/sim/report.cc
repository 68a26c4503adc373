#include "tools/sim/report.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_io.h"

extern char** environ;

namespace tutti::sim {
namespace {

std::string Pixels(uint64_t p) {
  return p >= 10000000 ? absl::StrFormat("%.0f MP", p / 1e6) : absl::StrFormat("%.1f MP", p / 1e6);
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

// Draws what LadderJson writes: per (run, sync) a row with the rungs'
// tokens/s per GPU (bars, efficiency against the ideal step written on
// them) and the per-rank compute over the mean (boxes: 5-95% whiskers,
// 25-75% box, the extremes as points).
constexpr char kPlotScript[] = R"py(
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt

data = json.load(open(sys.argv[1]))
rows = []
for run in data["runs"]:
    for sync in sorted({r["sync"] for r in run["rungs"]}):
        rows.append((run, sync, [r for r in run["rungs"] if r["sync"] == sync]))
fig, axes = plt.subplots(len(rows), 2, figsize=(14, 3.2 * len(rows)), squeeze=False)
for i, (run, sync, rungs) in enumerate(rows):
    names = [r["rung"] for r in rungs]
    x = list(range(len(rungs)))
    title = "W = %d, stage %.1f MP, %s" % (run["world_size"], run["stage_max_pixels"] / 1e6, sync)
    ax = axes[i][0]
    bars = ax.bar(x, [r["tokens_per_second_per_gpu"] for r in rungs], color="#4477aa")
    for b, r in zip(bars, rungs):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), "%.0f%%" % (100 * r["efficiency_ideal"]),
                ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.15 * max(b.get_height() for b in bars))  # room for the labels
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title(title + ": tokens/s (efficiency vs ideal step)", fontsize=9)
    ax = axes[i][1]
    stats = [{"med": r["spread"][3], "q1": r["spread"][2], "q3": r["spread"][4],
              "whislo": r["spread"][1], "whishi": r["spread"][5],
              "fliers": [r["spread"][0], r["spread"][6]], "label": r["rung"]} for r in rungs]
    ax.bxp(stats, showfliers=True)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("rank compute / mean")
    ax.set_title(title + ": per-rank load spread", fontsize=9)
fig.suptitle("tutti simulate: %s on %s, %s attention, %d steps" %
             (data["model"], data["cluster"], data["attention"], data["steps"]), fontsize=10)
fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (3.2 * len(rows))))  # below the title
fig.savefig(sys.argv[2], dpi=110)
)py";

}  // namespace

std::string LadderTable(const SimSetup& s, const std::vector<LadderRun>& runs) {
  std::string out = absl::StrFormat(
      "%s (%s) on %s nodes (%u GPUs each), %s ViT attention; %llu steps from step %llu\n",
      s.model.name, s.model.description, s.cluster.name, s.cluster.ranks_per_node,
      s.attention == Attention::kFlash ? "flash" : "eager",
      static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.from));
  for (const LadderRun& run : runs) {
    for (const SyncModel sync : s.syncs) {
      absl::StrAppendFormat(&out, "\nW = %u, stage max_pixels %s, sync %s\n", run.world_size,
                            Pixels(run.stage_max_pixels), SyncModelName(sync));
      absl::StrAppendFormat(&out, "%-24s %6s %8s %9s %8s %8s %8s %7s %7s %7s %6s %6s %6s\n", "rung",
                            "max_px", "step_s", "tok/s/GPU", "idle_vit", "idle_aud", "idle_llm",
                            "xchg_ms", "stall_s", "act_GB", "ideal", "bound", "text");
      for (const RungResult& r : run.rungs) {
        if (r.sync != sync) continue;
        absl::StrAppendFormat(
            &out,
            "%-24s %6s %8.3f %9.0f %7.1f%% %7.1f%% %7.1f%% %7.1f %7.3f %6.1f%s %5.1f%% %5.1f%% "
            "%5.1f%%\n",
            r.rung, Pixels(r.max_pixels), r.step_seconds, r.tokens_per_second_per_gpu,
            100 * r.idle_share[kVit], 100 * r.idle_share[kAudio], 100 * r.idle_share[kLlm],
            1e3 * r.exchange_seconds, r.stall_seconds, r.peak_activation_bytes / 1e9,
            r.fits_memory ? " " : "!", 100 * r.efficiency_ideal, 100 * r.efficiency_bound,
            100 * r.efficiency_text_only);
      }
    }
  }
  absl::StrAppend(&out,
                  "\nidle: the phase's slowest-rank time not matched by the mean rank (1 - "
                  "mean/max); xchg_ms: the post-balancing exchange (slowest rank, forward and "
                  "back); ideal: the same work perfectly balanced, no stall, no exchange, over "
                  "the step; bound: the highest ideal any placement of whole images reaches (the "
                  "step's most costly image is encoded whole on one rank); text: text-only "
                  "training of the same tokens over the step; act_GB: "
                  "peak activation memory of a rank (! = with the model's states above the GPU's "
                  "memory)\n");
  return out;
}

std::string LadderJson(const SimSetup& s, const std::vector<LadderRun>& runs) {
  std::string out = absl::StrFormat(
      "{\"model\": \"%s\", \"cluster\": \"%s\", \"attention\": \"%s\", \"steps\": %llu, "
      "\"from\": %llu, \"runs\": [",
      Escape(s.model.name), Escape(s.cluster.name),
      s.attention == Attention::kFlash ? "flash" : "eager",
      static_cast<unsigned long long>(s.steps), static_cast<unsigned long long>(s.from));
  for (size_t i = 0; i < runs.size(); ++i) {
    const LadderRun& run = runs[i];
    absl::StrAppendFormat(
        &out, "%s\n {\"world_size\": %u, \"stage_max_pixels\": %llu, \"rungs\": [", i ? "," : "",
        run.world_size, static_cast<unsigned long long>(run.stage_max_pixels));
    for (size_t j = 0; j < run.rungs.size(); ++j) {
      const RungResult& r = run.rungs[j];
      std::vector<std::string> spread;
      for (double q : r.spread) spread.push_back(absl::StrFormat("%.6f", q));
      absl::StrAppendFormat(
          &out,
          "%s\n  {\"rung\": \"%s\", \"sync\": \"%s\", \"max_pixels\": %llu, \"steps\": %llu, "
          "\"step_seconds\": %.6f, \"tokens_per_second\": %.1f, \"tokens_per_second_per_gpu\": "
          "%.2f, \"idle_share\": {\"vit\": %.6f, \"audio\": %.6f, \"llm\": %.6f}, "
          "\"exchange_seconds\": %.6f, \"stall_seconds\": %.6f, \"peak_activation_bytes\": %.0f, "
          "\"state_bytes\": %.0f, \"fits_memory\": %s, \"efficiency_ideal\": %.6f, "
          "\"efficiency_text_only\": %.6f, \"efficiency_bound\": %.6f, \"inter_node_bytes\": "
          "%.0f, \"spread\": [%s]}",
          j ? "," : "", Escape(r.rung), SyncModelName(r.sync),
          static_cast<unsigned long long>(r.max_pixels), static_cast<unsigned long long>(r.steps),
          r.step_seconds, r.tokens_per_second, r.tokens_per_second_per_gpu, r.idle_share[kVit],
          r.idle_share[kAudio], r.idle_share[kLlm], r.exchange_seconds, r.stall_seconds,
          r.peak_activation_bytes, r.state_bytes, r.fits_memory ? "true" : "false",
          r.efficiency_ideal, r.efficiency_text_only, r.efficiency_bound, r.inter_node_bytes,
          absl::StrJoin(spread, ", "));
    }
    out += "]}";
  }
  out += "\n]}\n";
  return out;
}

std::string FitExperimentText(const FitExperimentOptions& o, const FitExperimentResult& r) {
  std::string out = absl::StrFormat(
      "online cost fit, W = %u, %llu steps, strategy %s%s, configured quadratic terms %gx the "
      "true ones; %llu fit rounds (%llu refused), %zu fits announced\n",
      o.world_size, static_cast<unsigned long long>(o.steps), o.strategy,
      o.post_balancing ? " + post-balancing" : "", o.off_by,
      static_cast<unsigned long long>(r.rounds), static_cast<unsigned long long>(r.refused),
      r.fits.size());
  for (const packer::CostFitEntry& e : r.fits) {
    absl::StrAppendFormat(&out,
                          "  fit %u from step %llu: vit %.4g + %.4g p^2 (p_ref %.0f), llm %.4g + "
                          "%.4g n^2\n",
                          e.id, static_cast<unsigned long long>(e.from_step), e.cost.vit_linear,
                          e.cost.vit_quadratic, e.cost.vit_linear / e.cost.vit_quadratic,
                          e.cost.llm_linear, e.cost.llm_quadratic);
  }
  absl::StrAppendFormat(&out,
                        "slowest rank over the mean rank (true seconds), mean of %llu steps:\n",
                        static_cast<unsigned long long>(o.window));
  absl::StrAppendFormat(&out, "  %-36s %8s %8s %8s\n", "", "vit", "llm", "compute");
  auto row = [&](const char* name, const FitExperimentResult::Summary& m) {
    absl::StrAppendFormat(&out, "  %-36s %8.4f %8.4f %8.4f\n", name, m.vit, m.llm, m.compute);
  };
  row("first steps (configured constants)", r.before);
  row("last steps, with the online fit", r.after);
  row("last steps, configured throughout", r.configured_after);
  row("last steps, true constants", r.truth_after);
  const bool met = r.after.vit <= 1.02 && r.after.llm <= 1.02;
  absl::StrAppendFormat(&out, "goal <= 1.02 after the fit: %s", met ? "met" : "not met");
  if (!met && r.truth_after.vit > 1.02 && r.after.vit <= r.truth_after.vit * 1.005) {
    // The plan with the true constants is no better: the phase is bound by
    // what no cost model can split (an image is encoded whole on one rank).
    absl::StrAppendFormat(&out,
                          " (the true constants give %.4f too: the largest images bound the "
                          "encoder phase, not the constants)",
                          r.truth_after.vit);
  }
  absl::StrAppend(&out, "\n");
  return out;
}

std::string FitExperimentJson(const FitExperimentOptions& o, const FitExperimentResult& r) {
  auto summary = [](const FitExperimentResult::Summary& m) {
    return absl::StrFormat("{\"vit\": %.6f, \"llm\": %.6f, \"compute\": %.6f}", m.vit, m.llm,
                           m.compute);
  };
  std::vector<std::string> fits;
  for (const packer::CostFitEntry& e : r.fits) {
    fits.push_back(absl::StrFormat(
        "{\"id\": %u, \"from_step\": %llu, \"vit_linear\": %.9g, \"vit_quadratic\": %.9g, "
        "\"llm_linear\": %.9g, \"llm_quadratic\": %.9g}",
        e.id, static_cast<unsigned long long>(e.from_step), e.cost.vit_linear, e.cost.vit_quadratic,
        e.cost.llm_linear, e.cost.llm_quadratic));
  }
  return absl::StrFormat(
      "{\"world_size\": %u, \"steps\": %llu, \"off_by\": %g, \"strategy\": \"%s\", \"rounds\": "
      "%llu, \"refused\": %llu, \"fits\": [%s], \"before\": %s, \"after\": %s, "
      "\"configured_after\": %s, \"truth_after\": %s}\n",
      o.world_size, static_cast<unsigned long long>(o.steps), o.off_by, Escape(o.strategy),
      static_cast<unsigned long long>(r.rounds), static_cast<unsigned long long>(r.refused),
      absl::StrJoin(fits, ", "), summary(r.before), summary(r.after), summary(r.configured_after),
      summary(r.truth_after));
}

absl::Status PlotLadder(const std::string& json, const std::string& png,
                        const std::string& python) {
  char dir_template[] = "/tmp/tutti-plot.XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr)
    return absl::InternalError("cannot create a temporary directory for the plot");
  const std::string script = absl::StrCat(dir, "/plot_ladder.py");
  const std::string data = absl::StrCat(dir, "/ladder.json");
  const std::string log = absl::StrCat(dir, "/stderr");
  absl::Status s = WriteFileAtomically(script, kPlotScript);
  if (s.ok()) s = WriteFileAtomically(data, json);
  if (s.ok()) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::vector<std::string> args = {python, script, data, png};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, python.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    int status = 0;
    if (rc != 0) {
      s = absl::FailedPreconditionError(absl::StrCat(
          "--plot: cannot run ", python, " (", std::strerror(rc),
          "); set TUTTI_PYTHON to a Python 3 with matplotlib (Debian: python3-matplotlib)"));
    } else if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
               WEXITSTATUS(status) != 0) {
      auto err = ReadFileToString(log);
      s = absl::FailedPreconditionError(
          absl::StrCat("--plot: ", python, " could not draw ", png,
                       " (it needs matplotlib: Debian's "
                       "python3-matplotlib): ",
                       err.ok() ? err->substr(err->size() > 600 ? err->size() - 600 : 0)
                                : std::string("no output")));
    }
  }
  for (const std::string& f : {script, data, log}) std::remove(f.c_str());
  ::rmdir(dir);
  return s;
}

}  // namespace tutti::sim

#include "tools/sim/step_work.h"

#include <algorithm>
#include <numeric>

#include "common/rng.h"

namespace tutti::sim {
namespace {

using packer::PlannedImage;
using packer::PlannedSample;
using packer::StepPlanData;

void AddImages(const packer::Index& ix, const StepPlanData& d, uint32_t rpn, StepWork* w) {
  w->node_items.assign((d.world_size + rpn - 1) / rpn, {});
  for (const PlannedImage& im : d.images) {
    DataItem item;
    item.bytes = ix.media(im.media).size;
    item.megapixels = double(ix.media_width(im.media)) * ix.media_height(im.media) / 1e6;
    item.key = im.media;
    w->node_items[im.enc_rank / rpn].push_back(item);
  }
}

Segment Zero(PhaseKind kind, uint32_t W) { return Segment{kind, std::vector<double>(W, 0.0)}; }

}  // namespace

StepWork PlannedWork(const packer::Job& job, const StepPlanData& d, const WorkOptions& o) {
  const uint32_t W = d.world_size;
  const uint32_t rpn = std::max<uint32_t>(1, d.ranks_per_node);
  const ItemTiming& t = o.timing;
  StepWork w;
  w.world_size = W;
  w.activation_bytes.assign(W, 0.0);
  Segment vit = Zero(kVit, W), audio = Zero(kAudio, W);
  std::vector<double> largest(W, 0.0);
  for (const PlannedImage& im : d.images) {
    vit.seconds[im.enc_rank] += t.Vit(im.patches);
    w.largest_vit_seconds = std::max(w.largest_vit_seconds, t.Vit(im.patches));
    largest[im.enc_rank] = std::max<double>(largest[im.enc_rank], im.patches);
  }
  for (const packer::PlannedAudio& au : d.audio) audio.seconds[au.enc_rank] += t.Audio(au.tokens);
  for (uint32_t r = 0; r < W && r + 1 < d.rank_chunks.size(); ++r) {
    for (uint32_t c = d.rank_chunks[r]; c < d.rank_chunks[r + 1]; ++c) {
      w.activation_bytes[r] = std::max(
          w.activation_bytes[r],
          VitActivationBytes(*o.model, double(d.chunk_patches[c]), largest[r], o.attention));
    }
  }
  w.segments.push_back(std::move(vit));
  if (!d.audio.empty()) w.segments.push_back(std::move(audio));
  // The exchange: per rank the bytes it sends and receives within its node
  // and across nodes, each link at its bandwidth.
  std::vector<double> send_in(W, 0), recv_in(W, 0), send_out(W, 0), recv_out(W, 0);
  bool moves = false;
  for (uint32_t i = 0; i < d.num_encoder_items(); ++i) {
    const uint32_t e = d.EncRank(i), l = d.LlmRank(i);
    if (e == l) continue;
    moves = true;
    const double bytes = static_cast<double>(d.OutputBytes(i));
    if (e / rpn == l / rpn) {
      send_in[e] += bytes, recv_in[l] += bytes;
      w.intra_node_bytes += d.OutputBytes(i);
    } else {
      send_out[e] += bytes, recv_out[l] += bytes;
      w.inter_node_bytes += d.OutputBytes(i);
    }
  }
  Segment exchange = Zero(kExchange, W);
  if (moves) {
    for (uint32_t r = 0; r < W; ++r) {
      exchange.seconds[r] = std::max(send_in[r], recv_in[r]) / o.cluster->nvlink_bandwidth +
                            std::max(send_out[r], recv_out[r]) / o.cluster->network_bandwidth;
    }
    w.segments.push_back(exchange);
  }
  // The LLM's micro-batches: text sequences first, then VL ones.
  const MicroBatchSplit& split = job.split();
  const uint32_t tmb = job.config().batch().text_micro_batch();
  const uint32_t vmb = job.config().batch().vl_micro_batch();
  const uint32_t M = split.text_micro_batches + split.vl_micro_batches;
  std::vector<Segment> llm(M, Zero(kLlm, W));
  std::vector<std::vector<double>> tokens(M, std::vector<double>(W, 0.0));
  const uint32_t S = d.seqs_per_rank();
  for (uint32_t r = 0; r < W; ++r) {
    for (uint32_t q = 0; q < S; ++q) {
      const uint32_t m = q < d.text_seqs ? q / std::max<uint32_t>(1, tmb)
                                         : split.text_micro_batches +
                                               (q - d.text_seqs) / std::max<uint32_t>(1, vmb);
      const uint32_t row = r * S + q;
      if (m >= M || row >= d.docs.rows()) continue;
      for (const uint32_t *k = d.docs.row(row), *e = k + d.docs.size(row); k < e; ++k) {
        const uint32_t n = d.samples[*k].cost.llm_tokens;
        llm[m].seconds[r] += t.Llm(n);
        tokens[m][r] += n;
        w.llm_tokens += n;
      }
    }
  }
  for (uint32_t m = 0; m < M; ++m) {
    for (uint32_t r = 0; r < W; ++r) {
      w.activation_bytes[r] =
          std::max(w.activation_bytes[r], LlmActivationBytes(*o.model, tokens[m][r]));
    }
    w.segments.push_back(std::move(llm[m]));
  }
  if (moves) w.segments.push_back(exchange);  // the backward exchange of the same bytes
  AddImages(job.index(), d, rpn, &w);
  return w;
}

StepWork NaiveWork(const packer::Job& job, const StepPlanData& d, const WorkOptions& o) {
  const uint32_t W = d.world_size;
  const uint32_t rpn = std::max<uint32_t>(1, d.ranks_per_node);
  const ItemTiming& t = o.timing;
  const uint32_t seq_len = d.seq_len;
  const uint32_t G = std::max<uint32_t>(1, job.config().batch().grad_accum());
  const uint32_t per_mb = std::max<uint32_t>(1, (d.seqs_per_rank() + G - 1) / G);
  StepWork w;
  w.world_size = W;
  w.activation_bytes.assign(W, 0.0);
  std::vector<std::vector<uint32_t>> mine(W);
  for (uint32_t k = 0; k < d.samples.size(); ++k) mine[d.samples[k].drawn_rank].push_back(k);
  // Per rank and micro-batch: encoder and LLM seconds, patches, tokens.
  struct Mb {
    double vit = 0, audio = 0, llm = 0, patches = 0, largest = 0, tokens = 0;
  };
  std::vector<std::vector<Mb>> mbs(W);
  size_t M = 0;
  for (uint32_t r = 0; r < W; ++r) {
    std::vector<uint32_t>& ks = mine[r];
    Rng rng(MixSeed(job.config().seed() ^ 0x6e61697665ull, d.step * W + r));
    for (size_t i = ks.size(); i > 1; --i) std::swap(ks[i - 1], ks[rng.Below(i)]);
    uint32_t seq = 0, fill = 0;
    for (const uint32_t k : ks) {
      const PlannedSample& ps = d.samples[k];
      if (fill > 0 && fill + ps.cost.llm_tokens > seq_len) ++seq, fill = 0;
      fill += ps.cost.llm_tokens;
      const uint32_t m = seq / per_mb;
      if (mbs[r].size() <= m) mbs[r].resize(m + 1);
      Mb& mb = mbs[r][m];
      mb.llm += t.Llm(ps.cost.llm_tokens);
      mb.tokens += ps.cost.llm_tokens;
      w.llm_tokens += ps.cost.llm_tokens;
      for (uint32_t i = ps.first_image; i < ps.first_image + ps.cost.images; ++i) {
        mb.vit += t.Vit(d.images[i].patches);
        w.largest_vit_seconds = std::max(w.largest_vit_seconds, t.Vit(d.images[i].patches));
        mb.patches += d.images[i].patches;
        mb.largest = std::max<double>(mb.largest, d.images[i].patches);
      }
      for (uint32_t a = ps.first_audio; a < ps.first_audio + ps.cost.audio; ++a) {
        mb.audio += t.Audio(d.audio[a].tokens);
      }
    }
    M = std::max(M, mbs[r].size());
  }
  const bool any_audio = !d.audio.empty();
  for (size_t m = 0; m < M; ++m) {
    Segment vit = Zero(kVit, W), audio = Zero(kAudio, W), llm = Zero(kLlm, W);
    for (uint32_t r = 0; r < W; ++r) {
      if (m >= mbs[r].size()) continue;
      const Mb& mb = mbs[r][m];
      vit.seconds[r] = mb.vit;
      audio.seconds[r] = mb.audio;
      llm.seconds[r] = mb.llm;
      w.activation_bytes[r] = std::max(
          {w.activation_bytes[r], VitActivationBytes(*o.model, mb.patches, mb.largest, o.attention),
           LlmActivationBytes(*o.model, mb.tokens)});
    }
    w.segments.push_back(std::move(vit));
    if (any_audio) w.segments.push_back(std::move(audio));
    w.segments.push_back(std::move(llm));
  }
  // Each rank decodes the images it drew.
  w.node_items.assign((W + rpn - 1) / rpn, {});
  for (const PlannedImage& im : d.images) {
    DataItem item;
    item.bytes = job.index().media(im.media).size;
    item.megapixels =
        double(job.index().media_width(im.media)) * job.index().media_height(im.media) / 1e6;
    item.key = im.media;
    w.node_items[d.samples[im.owner].drawn_rank / rpn].push_back(item);
  }
  return w;
}

}  // namespace tutti::sim

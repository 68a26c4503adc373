#include "services/packer/core/post_balancing/plan_check.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace tutti::dispatch {
namespace {

absl::Status Fail(const std::string& what) { return absl::InternalError(what); }

bool SameItem(const ExchangeItem& a, const ExchangeItem& b) {
  return a.sample == b.sample && a.encoder == b.encoder && a.payload == b.payload &&
         a.index == b.index && a.bytes == b.bytes;
}

// (src, dst, sample, encoder, payload, index) -> bytes, from the send lists.
using MoveKey = std::tuple<uint32_t, uint32_t, uint32_t, int, int, uint32_t>;

absl::Status CollectSends(const std::vector<RankExchange>& x, std::map<MoveKey, uint64_t>* out) {
  for (uint32_t r = 0; r < x.size(); ++r) {
    uint64_t total = 0;
    for (const Transfer& t : x[r].sends) {
      uint64_t bytes = 0;
      for (const ExchangeItem& it : t.items) {
        bytes += it.bytes;
        const MoveKey key{r, t.peer, it.sample, int(it.encoder), int(it.payload), it.index};
        if (!out->emplace(key, it.bytes).second) {
          return Fail(absl::StrCat("rank ", r, " sends sample ", it.sample, " item ", it.index,
                                   " to rank ", t.peer, " twice"));
        }
      }
      if (bytes != t.bytes) {
        return Fail(absl::StrCat("rank ", r, " transfer to ", t.peer, " says ", t.bytes,
                                 " bytes, its items sum to ", bytes));
      }
      total += bytes;
    }
    if (total != x[r].send_bytes) {
      return Fail(absl::StrCat("rank ", r, " send_bytes ", x[r].send_bytes, " != ", total));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckExchangeSymmetry(const std::vector<RankExchange>& x) {
  const uint32_t W = static_cast<uint32_t>(x.size());
  std::vector<size_t> sent_to(W, 0);
  for (uint32_t s = 0; s < W; ++s) {
    for (const Transfer& t : x[s].sends) {
      if (t.peer < W) sent_to[t.peer] += t.items.size();
    }
  }
  for (uint32_t r = 0; r < W; ++r) {
    uint32_t prev = 0;
    for (size_t k = 0; k < x[r].sends.size(); ++k) {
      const Transfer& t = x[r].sends[k];
      if (t.peer >= W || (k > 0 && t.peer <= prev)) {
        return Fail(absl::StrCat("rank ", r, " send list is not in increasing peer order"));
      }
      prev = t.peer;
      const auto& recvs = x[t.peer].recvs;
      auto it =
          std::find_if(recvs.begin(), recvs.end(), [&](const Transfer& u) { return u.peer == r; });
      if (it == recvs.end() || it->items.size() != t.items.size() || it->bytes != t.bytes) {
        return Fail(absl::StrCat("rank ", r, " sends ", t.items.size(), " items to rank ", t.peer,
                                 ", which does not receive the same from it"));
      }
      for (size_t i = 0; i < t.items.size(); ++i) {
        if (!SameItem(t.items[i], it->items[i])) {
          return Fail(absl::StrCat("rank ", r, " -> ", t.peer, ": item ", i,
                                   " differs between send and receive lists"));
        }
      }
    }
    size_t recv_items = 0;
    uint64_t recv_bytes = 0;
    for (size_t k = 0; k < x[r].recvs.size(); ++k) {
      if (k > 0 && x[r].recvs[k].peer <= x[r].recvs[k - 1].peer) {
        return Fail(absl::StrCat("rank ", r, " receive list is not in increasing peer order"));
      }
      recv_items += x[r].recvs[k].items.size();
      recv_bytes += x[r].recvs[k].bytes;
    }
    if (recv_bytes != x[r].recv_bytes) {
      return Fail(absl::StrCat("rank ", r, " recv_bytes ", x[r].recv_bytes, " != ", recv_bytes));
    }
    // Every send has its receive (checked above); equal counts mean no
    // receive lacks its send.
    if (sent_to[r] != recv_items) {
      return Fail(
          absl::StrCat("rank ", r, " receives ", recv_items, " items but is sent ", sent_to[r]));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPlan(const DispatchInput& in, const DispatchOptions& o,
                       const DispatchPlan& plan) {
  const ClusterShape& c = o.cluster;
  const uint32_t W = c.world_size;
  const size_t n = in.samples.size();
  // Encoder phases.
  std::map<MoveKey, uint64_t> want_fwd, want_load;
  for (int e = 0; e < kNumEncoders; ++e) {
    const EncoderPhasePlan& ep = plan.encoders[e];
    const auto& off = plan.item_offset[e];
    if (off.size() != n + 1 || ep.rank.size() != off[n] || ep.rank_items.size() != W) {
      return Fail(absl::StrCat(EncoderPhaseName(kEncoders[e]), " phase has the wrong shape"));
    }
    std::vector<uint8_t> seen(off[n], 0);
    for (uint32_t r = 0; r < W; ++r) {
      for (const ItemRef& ref : ep.rank_items[r]) {
        if (ref.sample >= n || ref.item >= in.samples[ref.sample].items[e].size()) {
          return Fail(absl::StrCat("rank ", r, " encodes an item that does not exist"));
        }
        const uint32_t i = off[ref.sample] + ref.item;
        if (seen[i]++) return Fail(absl::StrCat("item ", i, " is encoded twice"));
        if (ep.rank[i] != r) {
          return Fail(
              absl::StrCat("item ", i, " is listed on rank ", r, " but placed on ", ep.rank[i]));
        }
        const Sample& s = in.samples[ref.sample];
        const EncoderItem& it = s.items[e][ref.item];
        const bool remote = !in.availability.Has(s.shard, c.node_of(r));
        if (bool(ep.remote_load[i]) != remote) {
          return Fail(absl::StrCat("item ", i, " remote_load flag is wrong"));
        }
        if (remote) {
          if (!in.availability.Has(s.shard, c.node_of(ep.load_source[i]))) {
            return Fail(absl::StrCat("item ", i, " is loaded on a node without its shard"));
          }
          want_load[{ep.load_source[i], r, ref.sample, e, int(Payload::kEncoderInput), it.index}] =
              it.input_bytes;
        }
        want_fwd[{r, plan.llm_rank[ref.sample], ref.sample, e, int(Payload::kEncoderOutput),
                  it.index}] = EmbeddingBytes(it.output_tokens, o);
      }
    }
    for (size_t i = 0; i < seen.size(); ++i) {
      if (!seen[i]) return Fail(absl::StrCat("item ", i, " is encoded nowhere"));
    }
  }
  // LLM phase.
  const SlotLayout& sl = o.slots;
  if (plan.llm.size() != W || plan.llm_rank.size() != n)
    return Fail("LLM phase has the wrong shape");
  std::vector<uint8_t> placed(n, 0);
  for (uint32_t r = 0; r < W; ++r) {
    const auto& mbs = plan.llm[r].micro_batches;
    if (mbs.size() != sl.micro_batches()) {
      return Fail(absl::StrCat("rank ", r, " has ", mbs.size(), " micro-batches, not ",
                               sl.micro_batches()));
    }
    for (uint32_t mb = 0; mb < mbs.size(); ++mb) {
      if (mbs[mb].vl != (mb >= sl.text_micro_batches) ||
          mbs[mb].sequences.size() != sl.micro_batch_size(mb)) {
        return Fail(absl::StrCat("rank ", r, " micro-batch ", mb, " has the wrong layout"));
      }
      for (const SequencePlan& sp : mbs[mb].sequences) {
        uint32_t tokens = 0;
        for (uint32_t s : sp.docs) {
          if (s >= n || placed[s]++) return Fail(absl::StrCat("sample ", s, " placed twice"));
          if (in.samples[s].vl != mbs[mb].vl) {
            return Fail(absl::StrCat("sample ", in.samples[s].sample_id,
                                     " shares a micro-batch with the other modality"));
          }
          if (plan.llm_rank[s] != r) return Fail(absl::StrCat("sample ", s, " llm_rank mismatch"));
          tokens += in.samples[s].llm_tokens;
          if (plan.text_remote[s] != !in.availability.Has(in.samples[s].shard, c.node_of(r))) {
            return Fail(absl::StrCat("sample ", s, " text_remote flag is wrong"));
          }
          if (plan.text_remote[s]) {
            want_load[{plan.text_source[s], r, s, int(EncoderKind::kVision),
                       int(Payload::kTextTokens), 0}] =
                uint64_t{in.samples[s].text_tokens} * o.token_id_bytes;
          }
        }
        if (tokens != sp.tokens || tokens > sl.seq_len) {
          return Fail(absl::StrCat("rank ", r, " sequence of ", tokens, " tokens (recorded ",
                                   sp.tokens, ") breaks seq_len ", sl.seq_len));
        }
      }
    }
  }
  for (size_t s = 0; s < n; ++s) {
    if (!placed[s])
      return Fail(absl::StrCat("sample ", in.samples[s].sample_id, " is in no sequence"));
  }
  // Exchanges.
  for (const auto* x : {&plan.forward, &plan.load}) {
    if (x->size() != W) return Fail("exchange has the wrong number of ranks");
    if (absl::Status st = CheckExchangeSymmetry(*x); !st.ok()) return st;
  }
  std::map<MoveKey, uint64_t> got_fwd, got_load;
  if (absl::Status st = CollectSends(plan.forward, &got_fwd); !st.ok()) return st;
  if (absl::Status st = CollectSends(plan.load, &got_load); !st.ok()) return st;
  if (got_fwd != want_fwd) {
    return Fail(absl::StrCat("forward exchange moves ", got_fwd.size(), " items, the phases need ",
                             want_fwd.size(), " (or bytes or endpoints differ)"));
  }
  if (got_load != want_load) {
    return Fail(absl::StrCat("load exchange moves ", got_load.size(), " inputs, remote loads need ",
                             want_load.size(), " (or bytes or endpoints differ)"));
  }
  return absl::OkStatus();
}

}  // namespace tutti::dispatch

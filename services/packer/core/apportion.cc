#include "services/packer/core/apportion.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tutti::packer {
namespace {

using u128 = unsigned __int128;

uint64_t Gcd(uint64_t a, uint64_t b) { return std::gcd(a, b); }

uint64_t CeilDiv(u128 x, u128 y) {
  if ((x >> 63) == 0 && (y >> 63) == 0) {  // a 64-bit division, not __udivti3
    const uint64_t a = static_cast<uint64_t>(x), b = static_cast<uint64_t>(y);
    return a / b + (a % b != 0);
  }
  return static_cast<uint64_t>((x + y - 1) / y);
}

// PD^2's group deadline of a heavy source's subtask with this deadline
// (weight w = p / U >= 1/2): ceil(ceil(d (1 - w)) / (1 - w)); 0 for a light
// one, which ranks after every heavy one at equal deadline and b-bit.
uint64_t GroupDeadline(u128 U, uint64_t p, uint64_t deadline) {
  if (2 * u128{p} < U) return 0;
  const u128 rest = U - p;
  const u128 g = CeilDiv(u128{deadline} * rest, U);
  return CeilDiv(g * U, rest);
}

}  // namespace

std::vector<uint64_t> ExactWeights(const std::vector<double>& w) {
  std::vector<uint64_t> out(w.size(), 0);
  double max_w = 0;
  for (double x : w) max_w = std::max(max_w, x);
  if (!(max_w > 0)) return out;
  bool done = false;
  // Decimals of at most 9 places (kept below 2^53 so the integer is exact).
  double scale = 1;
  for (int k = 0; k <= 9 && !done; ++k, scale *= 10) {
    if (max_w * scale >= 9.0e15) break;
    bool all = true;
    for (size_t i = 0; i < w.size() && all; ++i) {
      const double x = w[i] * scale;
      all = std::abs(x - std::round(x)) <= 1e-12 * std::max(1.0, x);
    }
    if (!all) continue;
    for (size_t i = 0; i < w.size(); ++i)
      out[i] = static_cast<uint64_t>(std::llround(w[i] * scale));
    done = true;
  }
  if (!done) {
    const double fixed = std::ldexp(1.0, 52) / max_w;
    for (size_t i = 0; i < w.size(); ++i)
      out[i] = static_cast<uint64_t>(std::llround(w[i] * fixed));
  }
  uint64_t g = 0;
  for (uint64_t x : out) g = Gcd(g, x);
  if (g > 1) {
    for (uint64_t& x : out) x /= g;
  }
  return out;
}

Apportionment::Apportionment(uint32_t per_step, uint32_t sources,
                             std::vector<ApportionSegment> segments)
    : per_step_(per_step), sources_(sources), max_count_(sources, 0) {
  for (size_t k = 0; k < segments.size(); ++k) {
    Seg g;
    g.start = segments[k].start_step;
    if (k + 1 < segments.size()) g.end = segments[k + 1].start_step;
    g.base.assign(sources, 0);
    g.p.assign(sources, 0);
    g.qU.assign(sources, 0);
    g.rU.assign(sources, 0);
    for (uint64_t x : segments[k].weights) g.U += x;
    uint64_t base_sum = 0;
    for (uint32_t s = 0; s < sources; ++s) {
      const u128 x = u128{per_step} * segments[k].weights[s];
      g.base[s] = static_cast<uint64_t>(x / g.U);
      g.p[s] = static_cast<uint64_t>(x % g.U);
      if (g.p[s] > 0) {
        g.qU[s] = static_cast<uint64_t>(g.U / g.p[s]);
        g.rU[s] = static_cast<uint64_t>(g.U % g.p[s]);
      }
      base_sum += g.base[s];
      max_count_[s] = std::max<uint32_t>(max_count_[s], g.base[s] + (g.p[s] > 0));
    }
    g.R = per_step - base_sum;
    const uint64_t U64 = static_cast<uint64_t>(g.U);
    g.period = U64 / Gcd(U64, per_step);
    segs_.push_back(std::move(g));
  }
  absl::MutexLock lock(&mu_);
  checkpoints_.resize(segs_.size());
  before_.resize(segs_.size());
  if (!before_.empty()) before_[0].assign(sources_, 0);
}

size_t Apportionment::SegmentOf(uint64_t step) const {
  size_t lo = 0, hi = segs_.size();
  while (hi - lo > 1) {
    const size_t mid = (lo + hi) / 2;
    (segs_[mid].start <= step ? lo : hi) = mid;
  }
  return lo;
}

void Apportionment::InitNext(const Seg& g, State* st) const {
  st->next.assign(sources_, Next());
  for (uint32_t s = 0; s < sources_; ++s) {
    const uint64_t p = g.p[s];
    if (p == 0) continue;
    const uint64_t i = st->extras[s] + 1;
    Next& n = st->next[s];
    n.release = static_cast<uint64_t>(u128{i - 1} * g.U / p);
    const u128 x = u128{i} * g.U;
    n.a = static_cast<uint64_t>(x / p);
    n.b = static_cast<uint64_t>(x % p);
  }
}

void Apportionment::Step(const Seg& g, State* st, std::vector<uint8_t>* took) const {
  // Eligible: released subtasks. PD^2 ranks them by deadline, then b-bit
  // (b = 1 first), then group deadline (later first); the rest by source.
  struct Cand {
    uint64_t key;  // deadline << 1 | (b == 0)
    uint32_t s;
  };
  thread_local std::vector<Cand> cands;
  cands.clear();
  took->assign(sources_, 0);
  for (uint32_t s = 0; s < sources_; ++s) {
    const Next& n = st->next[s];
    if (g.p[s] == 0 || n.release > st->j) continue;
    cands.push_back(Cand{(n.a + (n.b > 0)) << 1 | uint64_t{n.b == 0}, s});
  }
  // PD^2 leaves at least R subtasks eligible (every deadline is met); the
  // guard keeps a corrupt state from reading past the list.
  const size_t R = std::min<size_t>(g.R, cands.size());
  auto by_key = [](const Cand& x, const Cand& y) {
    return x.key < y.key || (x.key == y.key && x.s < y.s);
  };
  if (R > 0 && R < cands.size()) {
    std::nth_element(cands.begin(), cands.begin() + R, cands.end(), by_key);
    // Those ranked by the key alone are in; among those sharing the key of
    // the R-th, the group deadline decides (computed for them only).
    const uint64_t edge = cands[R].key;
    size_t in = 0;
    for (size_t k = 0; k < R; ++k) in += cands[k].key < edge;
    if (in < R) {
      auto mid = std::partition(cands.begin(), cands.end(),
                                [edge](const Cand& c) { return c.key < edge; });
      auto tied_end =
          std::partition(mid, cands.end(), [edge](const Cand& c) { return c.key == edge; });
      // The tied, by their group deadlines (each computed once), later first.
      const uint64_t deadline = edge >> 1;
      thread_local std::vector<std::pair<uint64_t, uint32_t>> tied;
      tied.clear();
      for (auto it = mid; it != tied_end; ++it) {
        tied.emplace_back(~GroupDeadline(g.U, g.p[it->s], deadline), it->s);
      }
      std::sort(tied.begin(), tied.end());
      for (size_t k = 0; k < tied.size(); ++k) mid[k].s = tied[k].second;
    }
  }
  for (size_t k = 0; k < R; ++k) {
    const uint32_t s = cands[k].s;
    (*took)[s] = 1;
    ++st->extras[s];
    // The next subtask: (i + 1) U = i U + U, without a division.
    Next& n = st->next[s];
    n.release = n.a;
    n.a += g.qU[s];
    n.b += g.rU[s];
    if (n.b >= g.p[s]) {
      n.b -= g.p[s];
      ++n.a;
    }
  }
  ++st->j;
}

void Apportionment::StateAt(size_t k, uint64_t j, State* st) const {
  const Seg& g = segs_[k];
  std::map<uint64_t, std::vector<uint64_t>>& cps = checkpoints_[k];
  const uint64_t words = (sources_ + 63) / 64;
  if (cps.empty()) cps.emplace(0, std::vector<uint64_t>(words, 0));  // j = 0: no extras yet
  // The nearest start at or before j: a checkpoint or a recent state.
  auto cp = std::prev(cps.upper_bound(j / kCheckpointSteps));
  const State* best = nullptr;
  for (const State& r : recent_) {
    if (r.seg == k && r.j <= j && (best == nullptr || r.j > best->j)) best = &r;
  }
  if (best != nullptr && best->j >= cp->first * kCheckpointSteps) {
    *st = *best;
  } else {
    st->seg = k;
    st->j = cp->first * kCheckpointSteps;
    st->extras.assign(sources_, 0);
    for (uint32_t s = 0; s < sources_; ++s) {
      const uint64_t floor_extras = static_cast<uint64_t>(u128{g.p[s]} * st->j / g.U);
      st->extras[s] = floor_extras + (cp->second[s / 64] >> (s % 64) & 1);
    }
    InitNext(g, st);
  }
  // Forward to j, keeping a checkpoint at every multiple of kCheckpointSteps
  // passed: whether each source's extra came early (lags stay within one).
  std::vector<uint8_t> took;
  while (st->j < j) {
    Step(g, st, &took);
    if (st->j % kCheckpointSteps != 0 || cps.count(st->j / kCheckpointSteps)) continue;
    std::vector<uint64_t> bits(words, 0);
    for (uint32_t s = 0; s < sources_; ++s) {
      const uint64_t floor_extras = static_cast<uint64_t>(u128{g.p[s]} * st->j / g.U);
      if (st->extras[s] > floor_extras) bits[s / 64] |= uint64_t{1} << (s % 64);
    }
    cps.emplace(st->j / kCheckpointSteps, std::move(bits));
  }
  // Remember it (a few states, replaced in turn).
  constexpr size_t kRecent = 32;
  if (recent_.size() < kRecent) {
    recent_.push_back(*st);
  } else {
    recent_[recent_next_] = *st;
    recent_next_ = (recent_next_ + 1) % kRecent;
  }
}

uint64_t Apportionment::ExtrasAfter(size_t k, uint64_t j, uint32_t s) const {
  const Seg& g = segs_[k];
  const uint64_t cycles = j / g.period, rest = j % g.period;
  const uint64_t per_period = static_cast<uint64_t>(u128{g.p[s]} * g.period / g.U);
  State st;
  StateAt(k, rest, &st);
  return cycles * per_period + st.extras[s];
}

const std::vector<uint64_t>& Apportionment::SegmentBefore(size_t k) const {
  size_t known = k;
  while (before_[known].empty()) --known;  // before_[0] is all zeros
  for (size_t i = known + 1; i <= k; ++i) {
    const Seg& g = segs_[i - 1];
    const uint64_t len = g.end - g.start;
    const uint64_t cycles = len / g.period, rest = len % g.period;
    State st;
    StateAt(i - 1, rest, &st);
    std::vector<uint64_t> out(sources_);
    for (uint32_t s = 0; s < sources_; ++s) {
      const uint64_t per_period = static_cast<uint64_t>(u128{g.p[s]} * g.period / g.U);
      out[s] = before_[i - 1][s] + g.base[s] * len + cycles * per_period + st.extras[s];
    }
    before_[i] = std::move(out);
  }
  return before_[k];
}

void Apportionment::AtLocked(uint64_t step, uint32_t* count, uint64_t* before) const {
  const size_t k = SegmentOf(step);
  const Seg& g = segs_[k];
  const uint64_t j = step - g.start;
  const uint64_t cycles = j / g.period, rest = j % g.period;
  State st;
  StateAt(k, rest, &st);
  if (before != nullptr) {
    const std::vector<uint64_t>& start = SegmentBefore(k);
    for (uint32_t s = 0; s < sources_; ++s) {
      const uint64_t per_period = static_cast<uint64_t>(u128{g.p[s]} * g.period / g.U);
      before[s] = start[s] + g.base[s] * j + cycles * per_period + st.extras[s];
    }
  }
  if (count != nullptr) {
    std::vector<uint8_t> took;
    Step(g, &st, &took);
    for (uint32_t s = 0; s < sources_; ++s) count[s] = static_cast<uint32_t>(g.base[s] + took[s]);
  }
}

void Apportionment::At(uint64_t step, uint32_t* count, uint64_t* before) const {
  absl::MutexLock lock(&mu_);
  AtLocked(step, count, before);
}

uint64_t Apportionment::Before(uint64_t step, uint32_t s) const {
  absl::MutexLock lock(&mu_);
  const size_t k = SegmentOf(step);
  const Seg& g = segs_[k];
  const uint64_t j = step - g.start;
  return SegmentBefore(k)[s] + g.base[s] * j + ExtrasAfter(k, j, s);
}

double Apportionment::Share(uint64_t step, uint32_t s) const {
  const Seg& g = segs_[SegmentOf(step)];
  return static_cast<double>(g.base[s]) + static_cast<double>(g.p[s]) / static_cast<double>(g.U);
}

uint64_t Apportionment::StepOf(uint32_t s, uint64_t q) const {
  absl::MutexLock lock(&mu_);
  // The last segment starting at or below q in this source's count.
  size_t k = 0;
  for (size_t i = 1; i < segs_.size(); ++i) {
    if (SegmentBefore(i)[s] > q) break;
    k = i;
  }
  // Within it the count is within one of start + a x j: a window of steps
  // around q's, searched for the last step whose `before` is <= q.
  const Seg& g = segs_[k];
  const uint64_t start = SegmentBefore(k)[s];
  if (g.base[s] == 0 && g.p[s] == 0) return g.start;  // it draws nothing from here on
  const double a =
      static_cast<double>(g.base[s]) + static_cast<double>(g.p[s]) / static_cast<double>(g.U);
  const double x = static_cast<double>(q - start);
  uint64_t lo = x > 1 ? static_cast<uint64_t>(std::max(0.0, std::floor((x - 1) / a) - 1)) : 0;
  uint64_t hi = static_cast<uint64_t>(std::ceil((x + 1) / a)) + 1;
  if (g.end != UINT64_MAX) hi = std::min(hi, g.end - g.start);
  while (lo > 0 && (start + g.base[s] * lo + ExtrasAfter(k, lo, s)) > q) lo = lo > 16 ? lo - 16 : 0;
  while ((start + g.base[s] * hi + ExtrasAfter(k, hi, s)) <= q) hi += 16;
  // before(lo) <= q < before(hi): the last j with before(j) <= q.
  while (hi - lo > 1) {
    const uint64_t mid = lo + (hi - lo) / 2;
    ((start + g.base[s] * mid + ExtrasAfter(k, mid, s)) <= q ? lo : hi) = mid;
  }
  return g.start + lo;
}

}  // namespace tutti::packer

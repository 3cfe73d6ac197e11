// PlanCache (strideattn.hpp): plans of recent problems, least recently used dropped first, and
// the process-wide one forward() and backward() use. A problem's key is a flat array of words
// (every shape, stride, dtype and option, each pointer's alignment class, the device of a
// device-memory problem) plus the varlen lists, compared exactly; building it costs no
// allocation unless the problem has varlen lists.
#include <array>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "dispatch/plan.hpp"
#include "dispatch/registry.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn {

namespace {

using detail::PlanAccess;
using detail::PlanState;

struct Key {
  static constexpr std::size_t kWords = 192;
  std::array<std::uint64_t, kWords> w;  // the first n are set (no need to clear the rest)
  std::size_t n = 0;
  std::uint64_t hash = 1469598103934665603ull;
  void add(std::uint64_t x) {
    w[n++] = x;
    hash = (hash ^ x) * 1099511628211ull;
    hash ^= hash >> 29;
  }
  void add_i(std::int64_t x) { add(static_cast<std::uint64_t>(x)); }
  [[nodiscard]] bool operator==(const Key& o) const {
    return n == o.n && hash == o.hash && std::memcmp(w.data(), o.w.data(), n * sizeof(std::uint64_t)) == 0;
  }
};

void add_view(Key* k, const TensorView& v) {
  k->add_i(static_cast<std::int64_t>(v.dtype));
  for (auto x : v.shape) k->add_i(x);
  for (auto x : v.stride) k->add_i(x);
  k->add(detail::alignment_class(v.data) | (v.data == nullptr ? 0x100u : 0u));
}

void add_bias(Key* k, const BiasView& v) {
  k->add_i(static_cast<std::int64_t>(v.dtype));
  for (auto x : v.shape) k->add_i(x);
  for (auto x : v.stride) k->add_i(x);
  k->add(detail::alignment_class(v.data) | (v.data == nullptr ? 0x100u : 0u));
}

void add_head(Key* k, const HeadView& v) {
  for (auto x : v.shape) k->add_i(x);
  for (auto x : v.stride) k->add_i(x);
  k->add(v.data == nullptr ? 1u : 0u);
}

template <class Args>
void add_common(Key* k, const Args& a, bool backward) {
  k->add(backward);
  k->add_i(static_cast<std::int64_t>(a.backend));
  k->add_i(static_cast<std::int64_t>(a.memory));
  // Plans of device memory are made for the current device.
  k->add_i(a.memory == Memory::device ? detail::current_device() : -1);
  add_view(k, a.q);
  add_view(k, a.k);
  add_view(k, a.v);
  add_view(k, a.o);
  for (auto x : a.lse.shape) k->add_i(x);
  for (auto x : a.lse.stride) k->add_i(x);
  k->add(detail::alignment_class(a.lse.data) | (a.lse.data == nullptr ? 0x100u : 0u));
  const AttentionOptions& o = a.options;
  k->add_i(static_cast<std::int64_t>(o.mask));
  k->add_i(o.window.left);
  k->add_i(o.window.right);
  std::uint64_t scale = 0;
  if (o.scale) std::memcpy(&scale, &*o.scale, sizeof scale);
  k->add(o.scale.has_value());
  k->add(scale);
  k->add(o.deterministic);
  // Training features: options and the tensors' views; the dropout seed and offset are the
  // run's, only whether they come through pointers is the plan's.
  std::uint64_t bits = 0;
  std::memcpy(&bits, &o.softcap, sizeof bits);
  k->add(bits);
  std::memcpy(&bits, &o.dropout.p, sizeof bits);
  k->add(bits);
  k->add(o.dropout.seed_ptr != nullptr);
  k->add(o.dropout.offset_ptr != nullptr);
  k->add_i(static_cast<std::int64_t>(o.bias_type));
  add_bias(k, a.bias);
  add_head(k, a.alibi_slopes);
  add_head(k, a.sinks);
  const Varlen& vl = a.varlen;
  k->add_i(vl.count);
  k->add_i(vl.max_seqlen_q);
  k->add_i(vl.max_seqlen_kv);
  for (const auto* list : {&vl.seqlens_q, &vl.seqlens_kv, &vl.offsets_q, &vl.offsets_kv}) {
    k->add(list->size());
    std::uint64_t h = 0x9e3779b97f4a7c15ull;
    for (auto x : *list) h = (h ^ static_cast<std::uint64_t>(x)) * 0xff51afd7ed558ccdull;
    k->add(h);
  }
}

Key key_of(const ForwardArgs& a) {
  Key k;
  add_common(&k, a, false);
  add_head(&k, a.max_logit);
  return k;
}

Key key_of(const BackwardArgs& a) {
  Key k;
  add_common(&k, a, true);
  add_view(&k, a.d_o);
  add_view(&k, a.dq);
  add_view(&k, a.dk);
  add_view(&k, a.dv);
  add_bias(&k, a.dbias);
  add_head(&k, a.d_sinks);
  return k;
}

bool lists_equal(const Varlen& a, const std::array<std::vector<std::int64_t>, 4>& b) {
  return a.seqlens_q == b[0] && a.seqlens_kv == b[1] && a.offsets_q == b[2] && a.offsets_kv == b[3];
}

}  // namespace

struct PlanCache::Impl {
  struct Entry {
    Key key;
    std::array<std::vector<std::int64_t>, 4> lists;  // the varlen lists the key hashed
    std::shared_ptr<const PlanState> state;
  };
  using List = std::list<Entry>;

  mutable std::mutex mu;
  std::size_t capacity;
  List lru;  // most recently used first
  std::unordered_multimap<std::uint64_t, List::iterator> index;
  std::uint64_t generation = 0;
  std::uint64_t hits = 0, misses = 0;

  explicit Impl(std::size_t cap) : capacity(cap == 0 ? 1 : cap), generation(detail::registry_generation()) {}

  void clear_locked() {
    lru.clear();
    index.clear();
  }

  // The entry for `key` and `varlen`, moved to the front; nullptr on a miss. Caller holds mu.
  std::shared_ptr<const PlanState> find_locked(const Key& key, const Varlen& varlen) {
    const std::uint64_t gen = detail::registry_generation();
    if (gen != generation) {  // backends were swapped (tests): the plans point at the old ones
      clear_locked();
      generation = gen;
    }
    auto [lo, hi] = index.equal_range(key.hash);
    for (auto it = lo; it != hi; ++it) {
      Entry& e = *it->second;
      if (e.key == key && lists_equal(varlen, e.lists)) {
        lru.splice(lru.begin(), lru, it->second);
        return e.state;
      }
    }
    return nullptr;
  }

  void insert_locked(const Key& key, const Varlen& varlen, std::shared_ptr<const PlanState> state) {
    if (find_locked(key, varlen)) return;  // another thread made it meanwhile
    while (lru.size() >= capacity) {
      const List::iterator last = std::prev(lru.end());
      auto [lo, hi] = index.equal_range(last->key.hash);
      for (auto it = lo; it != hi; ++it)
        if (it->second == last) {
          index.erase(it);
          break;
        }
      lru.pop_back();
    }
    lru.push_front(Entry{key, {varlen.seqlens_q, varlen.seqlens_kv, varlen.offsets_q, varlen.offsets_kv}, state});
    index.emplace(key.hash, lru.begin());
  }

  // memory_kinds: on a miss, whether the new plan asks where the pointers live (PlanAccess::
  // make); a plan taken from the cache never asks again, its runs do (check_run_memory).
  template <class Args>
  Status get(const Args& args, std::shared_ptr<const PlanState>* out, bool memory_kinds = true) {
    const Key key = key_of(args);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto s = find_locked(key, args.varlen)) {
        ++hits;
        *out = std::move(s);
        return Status::Ok();
      }
      ++misses;
    }
    std::shared_ptr<const PlanState> made;
    if (Status s = PlanAccess::make(args, detail::Pointers::bound, &made, memory_kinds); !s.ok()) return s;
    {
      std::lock_guard<std::mutex> lock(mu);
      insert_locked(key, args.varlen, made);
    }
    *out = std::move(made);
    return Status::Ok();
  }
};

PlanCache::PlanCache(std::size_t capacity) : impl_(new Impl(capacity)) {}

Status detail::PlanCacheAccess::get_for_size(PlanCache& cache, const ForwardArgs& args,
                                             std::shared_ptr<const PlanState>* out) {
  return cache.impl_->get(args, out, /*memory_kinds=*/false);
}
Status detail::PlanCacheAccess::get_for_size(PlanCache& cache, const BackwardArgs& args,
                                             std::shared_ptr<const PlanState>* out) {
  return cache.impl_->get(args, out, /*memory_kinds=*/false);
}
PlanCache::~PlanCache() { delete impl_; }

Status PlanCache::get(const ForwardArgs& args, ForwardPlan* plan) {
  if (!plan) return Status(StatusCode::invalid_argument, "PlanCache::get: plan is null");
  std::shared_ptr<const PlanState> st;
  if (Status s = impl_->get(args, &st); !s.ok()) return s;
  PlanAccess::set(plan, std::move(st));
  return Status::Ok();
}

Status PlanCache::get(const BackwardArgs& args, BackwardPlan* plan) {
  if (!plan) return Status(StatusCode::invalid_argument, "PlanCache::get: plan is null");
  std::shared_ptr<const PlanState> st;
  if (Status s = impl_->get(args, &st); !s.ok()) return s;
  PlanAccess::set(plan, std::move(st));
  return Status::Ok();
}

Status PlanCache::forward(const ForwardArgs& args) {
  std::shared_ptr<const PlanState> st;
  if (Status s = impl_->get(args, &st); !s.ok()) return s;
  return detail::run_plan(*st, detail::run_of(args));
}

Status PlanCache::backward(const BackwardArgs& args) {
  std::shared_ptr<const PlanState> st;
  if (Status s = impl_->get(args, &st); !s.ok()) return s;
  return detail::run_plan(*st, detail::run_of(args));
}

PlanCache::Stats PlanCache::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return {impl_->lru.size(), impl_->capacity, impl_->hits, impl_->misses};
}

void PlanCache::clear() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->clear_locked();
  impl_->hits = impl_->misses = 0;
}

PlanCache& default_plan_cache() {
  // Never destroyed: a plan's backend state (cuDNN graphs) must not be torn down after the CUDA
  // runtime at exit.
  static PlanCache* cache = new PlanCache(kDefaultPlanCacheCapacity);
  return *cache;
}

}  // namespace strideattn

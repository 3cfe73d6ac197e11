// Public entry points of KV-cache attention (strideattn/kv_cache.hpp): validation, the memory
// kind of every pointer (common/memory_check.hpp), backend selection on the problem's selection view
// (problem/kv_cache.hpp; backends without a KV-cache path are refused by the rule `kv_cache`), and the chosen backend's
// run, and the workspace query (the chosen backend's bytes). No plans yet: every call validates
// and selects.
#include <exception>
#include <new>
#include <string>

#include "common/memory_check.hpp"
#include "dispatch/backend.hpp"
#include "dispatch/gpu_module.hpp"
#include "dispatch/select.hpp"
#include "problem/kv_cache.hpp"
#include "strideattn/kv_cache.hpp"

namespace strideattn {

namespace {

// Where a pointer lives, asked of the GPU module's CUDA runtime (as the plans' memory check).
detail::PointerKind kv_pointer_kind(const void* ptr) {
  const detail::GpuModuleLoad& m = detail::gpu_module();
  if (m.module == nullptr || m.module->classify_pointer == nullptr) return detail::PointerKind::unknown;
  return m.module->classify_pointer(ptr);
}

}  // namespace

Status forward_with_kvcache(const KvCacheArgs& args) {
  try {
    detail::KvCacheProblem p;
    if (Status s = detail::make_kvcache_problem(args, &p); !s.ok()) return s;
    // Every pointer where `memory` says (the GPU module's query; none without one).
    if (Status s = detail::check_memory(args, &kv_pointer_kind); !s.ok()) return s;
    const detail::Problem sel_problem = detail::selection_problem(p);
    detail::Selection sel = detail::select_backend(sel_problem, args.backend, detail::VerdictScope::until_chosen);
    if (!sel.chosen) return sel.status;
    detail::BackendImpl* impl = detail::backend_impl(*sel.chosen);
    if (impl == nullptr) return Status(StatusCode::internal, "forward_with_kvcache: chosen backend is missing");
    return impl->forward_kvcache(p);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::backend_error, "forward_with_kvcache: out of host memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("forward_with_kvcache: internal error: ") + e.what());
  }
}

Status workspace_size(const KvCacheArgs& args, std::size_t* bytes) {
  if (bytes == nullptr) return Status(StatusCode::invalid_argument, "workspace_size: bytes is null");
  *bytes = 0;
  try {
    detail::KvCacheProblem p;
    if (Status s = detail::make_kvcache_problem(args, &p); !s.ok()) return s;
    p.args.workspace = nullptr;  // (a size query: an earlier, possibly freed, buffer may sit there)
    p.args.workspace_bytes = 0;
    const detail::Problem sel_problem = detail::selection_problem(p);
    detail::Selection sel = detail::select_backend(sel_problem, args.backend, detail::VerdictScope::until_chosen);
    if (!sel.chosen) return sel.status;
    const detail::BackendImpl* impl = detail::backend_impl(*sel.chosen);
    if (impl == nullptr) return Status(StatusCode::internal, "workspace_size: chosen backend is missing");
    return impl->kvcache_workspace_size(p, bytes);
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::backend_error, "workspace_size: out of host memory");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, std::string("workspace_size: internal error: ") + e.what());
  }
}

Explanation explain(const KvCacheArgs& args) {
  Explanation ex;
  try {
    detail::KvCacheProblem p;
    ex.validation = detail::make_kvcache_problem(args, &p);
    if (!ex.validation.ok()) return ex;
    ex.layout = detail::describe_kvcache(p);
    detail::explain_selection(detail::selection_problem(p), &ex);
    // the chosen backend's kernels (cuda: the decode kernels or the dense forward, and why)
    if (ex.chosen)
      if (const detail::BackendImpl* impl = detail::backend_impl(*ex.chosen))
        if (std::string note = impl->describe_kvcache_plan(p); !note.empty())
          for (Verdict& v : ex.verdicts)
            if (v.backend == *ex.chosen) v.reason += "; " + note;
  } catch (const std::exception& e) {
    ex.validation = Status(StatusCode::internal, std::string("internal error: ") + e.what());
  }
  return ex;
}

}  // namespace strideattn

# cuda backend tests. GPU tests carry the label `gpu` and skip, saying
# so, without a GPU; the support-rule and plan tests run everywhere the backend is compiled.
# The shared-memory swizzle arithmetic of the kernels: plain C++, checked in every build.
strideattn_test(cuda_swizzle_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/swizzle_test.cpp)
# The tile functions host and device code share: plain constexpr C++, checked in every build.
strideattn_test(cuda_tiles_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/tiles_test.cpp)
# The kernels' sequence-relative tensor addressing: plain host-device C++, every build too.
strideattn_test(cuda_tensor_ref_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/tensor_ref_test.cpp)
# The KV-cache addressing of the dense forward (fast page divide, paged rows, lengths): every build.
strideattn_test(cuda_kv_cache_rows_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/kv_cache_rows_test.cpp)
# The roundings of the backward's P (the forward's LSE, the exponent): host-device C++ too.
strideattn_test(cuda_lse_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/lse_test.cpp)
if(STRIDEATTN_HAVE_CUDA)
  # These call into the backend directly: they link the GPU module (which the core also loads).
  strideattn_test(cuda_rules_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_rules_test.cpp)
  target_link_libraries(cuda_rules_test PRIVATE strideattn_gpu)
  # The kernel table, make_cuda_plan's choices for described GPUs and what a prepared call
  # holds (no GPU needed).
  strideattn_test(cuda_plan_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/plan_test.cpp
                                 ${CMAKE_CURRENT_LIST_DIR}/ws_plan_test.cpp
                                 ${CMAKE_CURRENT_LIST_DIR}/feature_plan_test.cpp)
  target_link_libraries(cuda_plan_test PRIVATE strideattn_gpu CUDA::cudart)  # (launch.hpp: cuda_runtime.h)
  # The KV-cache path's plan (splits, workspace) and support rule for described GPUs (no GPU).
  strideattn_test(cuda_decode_plan_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/decode_plan_test.cpp)
  target_link_libraries(cuda_decode_plan_test PRIVATE strideattn_gpu CUDA::cudart)
  strideattn_test(cuda_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_test.cpp LABELS gpu)
  target_link_libraries(cuda_test PRIVATE strideattn_gpu CUDA::cudart)
  # (as the library: whether the build carries the sm_90a wgmma kernels)
  if("${CMAKE_CUDA_ARCHITECTURES}" MATCHES "90a")
    target_compile_definitions(cuda_test PRIVATE STRIDEATTN_CUDA_SM90A=1)
  endif()
  # The warp-specialized TMA forward (the default d <= 128 forward on sm_90a) against the
  # reference, and that it really runs; DISABLED_Timing times it against the wgmma forward.
  strideattn_test(cuda_ws_forward_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_ws_forward_test.cpp LABELS gpu)
  target_link_libraries(cuda_ws_forward_test PRIVATE strideattn_gpu CUDA::cudart)
  if("${CMAKE_CUDA_ARCHITECTURES}" MATCHES "90a")
    target_compile_definitions(cuda_ws_forward_test PRIVATE STRIDEATTN_CUDA_SM90A=1)
  endif()
  # The warp-specialized TMA dK/dV pass (the default d <= 128 single-pass dK/dV pass on sm_90a)
  # against the reference and the wgmma pass, and that it really runs; DISABLED_Timing times it.
  strideattn_test(cuda_ws_backward_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_ws_backward_test.cpp LABELS gpu)
  target_link_libraries(cuda_ws_backward_test PRIVATE strideattn_gpu CUDA::cudart)
  if("${CMAKE_CUDA_ARCHITECTURES}" MATCHES "90a")
    target_compile_definitions(cuda_ws_backward_test PRIVATE STRIDEATTN_CUDA_SM90A=1)
  endif()
  # The training features cuda runs (softcap, bias, ALiBi, sinks, max logit) against the reference.
  strideattn_test(cuda_features_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_features_test.cpp LABELS gpu)
  target_link_libraries(cuda_features_test PRIVATE strideattn_gpu CUDA::cudart)
  # Dropout on cuda: against the reference, the mask bit for bit, seeds from device pointers
  # and CUDA-graph replays.
  strideattn_test(cuda_dropout_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_dropout_test.cpp LABELS gpu)
  target_link_libraries(cuda_dropout_test PRIVATE strideattn_gpu CUDA::cudart)
  strideattn_test(cuda_large_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_large_test.cpp LABELS gpu)
  target_link_libraries(cuda_large_test PRIVATE CUDA::cudart)
  strideattn_test(cuda_edges_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_edges_test.cpp LABELS gpu)
  target_link_libraries(cuda_edges_test PRIVATE CUDA::cudart)
  # The backward over 2^22 queries or keys (stride-0 views): the folds, with and without.
  strideattn_test(cuda_long_backward_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_long_backward_test.cpp LABELS gpu)
  target_link_libraries(cuda_long_backward_test PRIVATE strideattn_gpu CUDA::cudart)
  # Forward and backward at logits up to 1e30 on every kernel pairing (the test hook).
  strideattn_test(cuda_magnitude_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_magnitude_test.cpp LABELS gpu)
  target_link_libraries(cuda_magnitude_test PRIVATE strideattn_gpu)
  # cu_seqlens arrays in device memory: every mask, plans, broken promises.
  strideattn_test(cuda_cu_seqlens_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cu_seqlens_test.cpp LABELS gpu)
  target_link_libraries(cuda_cu_seqlens_test PRIVATE strideattn_gpu CUDA::cudart)
  # KV-cache attention (decode kernels): paged and contiguous caches, appends, broken promises.
  strideattn_test(cuda_kvcache_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_kvcache_test.cpp LABELS gpu)
  target_link_libraries(cuda_kvcache_test PRIVATE strideattn_gpu CUDA::cudart)
  # KV-cache calls with many query rows (chunked prefill) through the dense forward, against
  # the reference, and forced onto the decode kernels on the same inputs.
  strideattn_test(cuda_kvcache_prefill_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_kvcache_prefill_test.cpp LABELS gpu)
  target_link_libraries(cuda_kvcache_prefill_test PRIVATE strideattn_gpu CUDA::cudart)
  # The device conversion of cu_seqlens arrays into the kernels' tables, on its own.
  strideattn_test(cuda_varlen_tables_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/varlen_tables_test.cpp LABELS gpu)
  target_link_libraries(cuda_varlen_tables_test PRIVATE strideattn_gpu CUDA::cudart)
endif()

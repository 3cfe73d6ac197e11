# Tests of the `cudnn` backend. Only in builds that contain it:
#  - cudnn_rules_test (label cpu): the support rules and the mask -> diagonal band mapping with
#    faked devices and cuDNN versions; no GPU needed.
#  - cudnn_gpu_test (label gpu): cudnn against the fp64 reference on the option matrix, cuda
#    and cudnn on the same inputs, refusals with reasons; skips (saying so) without a GPU.
#  - cudnn_nonfinite_test (label gpu): planted NaN / Inf against the fp64 reference under the
#    non-finite policy (also with every group's backward recomputed exactly), and where each
#    plant may and may not reach; skips without a GPU.
#  - cudnn_large_logits_test (label gpu): large logits and scales with gradients, with the
#    exact recompute of the backward at its default limits, off and on every group.
#  - cudnn_plan_gpu_test (label gpu): cudnn and cuda through plans, cudnn with cu_seqlens
#    arrays in device memory (and arrays that break the promise staying inside the views).
#  - cudnn_features_test (label gpu): the training features cudnn runs (the post-scale bias,
#    dBias) against the fp64 reference, the rest refused by rule; skips without a GPU.
#  - cudnn_kvcache_test (label gpu): KV-cache attention (contiguous and paged caches, appends,
#    masks, broken promises, a CUDA-graph replay) against the fp64 reference; skips without a GPU.
get_property(_have_cudnn GLOBAL PROPERTY STRIDEATTN_HAVE_CUDNN)
if(_have_cudnn)
  strideattn_test(cudnn_rules_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/rules_test.cpp)
  target_link_libraries(cudnn_rules_test PRIVATE strideattn_gpu)  # calls the rules directly
  strideattn_test(cudnn_gpu_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/gpu_test.cpp LABELS gpu)
  strideattn_test(cudnn_nonfinite_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/nonfinite_test.cpp LABELS gpu)
  target_link_libraries(cudnn_nonfinite_test PRIVATE strideattn_gpu CUDA::cudart)  # the recompute's hook
  strideattn_test(cudnn_large_logits_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/large_logits_test.cpp LABELS gpu)
  target_link_libraries(cudnn_large_logits_test PRIVATE strideattn_gpu)
  strideattn_test(cudnn_plan_gpu_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/plan_gpu_test.cpp LABELS gpu)
  target_link_libraries(cudnn_plan_gpu_test PRIVATE CUDA::cudart)
  strideattn_test(cudnn_features_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/features_test.cpp LABELS gpu)
  strideattn_test(cudnn_kvcache_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/kvcache_test.cpp LABELS gpu)
  target_link_libraries(cudnn_kvcache_test PRIVATE CUDA::cudart)
endif()

# Tests of the harness (runner, correctness rule) and the `strideattn` CLI.
strideattn_test(tools_runner_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tools/runner_test.cpp)
strideattn_test(compare_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tools/compare_test.cpp)
strideattn_test(conditioning_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tools/conditioning_test.cpp)
strideattn_test(magnitude_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tools/magnitude_test.cpp)

strideattn_test(tools_cli_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tools/cli_test.cpp)
target_link_libraries(tools_cli_test PRIVATE strideattn_cli_lib)
target_compile_definitions(tools_cli_test PRIVATE STRIDEATTN_CLI="$<TARGET_FILE:strideattn_cli>")
add_dependencies(tools_cli_test strideattn_cli)

strideattn_test(tools_cli_features_test SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/tools/cli_features_test.cpp)
target_link_libraries(tools_cli_features_test PRIVATE strideattn_cli_lib)
target_compile_definitions(tools_cli_features_test PRIVATE STRIDEATTN_CLI="$<TARGET_FILE:strideattn_cli>")
add_dependencies(tools_cli_features_test strideattn_cli)

set(_cli $<TARGET_FILE:strideattn_cli>)

# The demo (no arguments) must exit 0: every available backend agrees on the seed case.
add_test(NAME cli_demo COMMAND ${_cli})
set_tests_properties(cli_demo PROPERTIES LABELS cpu TIMEOUT 600)
# With STRIDEATTN_LOG=info the demo says which backend `auto` ran and why (issue 4)
# (the log line comes from the run of the `auto` row, on device memory when a GPU is present).
add_test(NAME cli_demo_logs_auto_choice COMMAND ${_cli})
set_tests_properties(cli_demo_logs_auto_choice PROPERTIES LABELS cpu TIMEOUT 600
  ENVIRONMENT "STRIDEATTN_LOG=info"
  PASS_REGULAR_EXPRESSION "\\[strideattn\\] forward runs on [a-z]+ \\(auto, class '[^']+', order [^;]+; first in order\\)")

# The issue's acceptance line.
add_test(NAME cli_check_seed_grad COMMAND ${_cli} check --preset seed --backends reference,cpu --grad)
set_tests_properties(cli_check_seed_grad PROPERTIES LABELS cpu TIMEOUT 900)

# 2,000 random problems and views, forward and backward, on the cpu backend; a quarter of them
# with inputs scaled up to the dtype's range, some with extreme scales or planted NaN / Inf
# (docs/semantics.md, "Non-finite values", "Conditioning").
add_test(NAME cli_fuzz_cpu_grad
         COMMAND ${_cli} fuzz --cases 2000 --grad --backends cpu --seed 1 --require-ran)
set_tests_properties(cli_fuzz_cpu_grad PROPERTIES LABELS cpu TIMEOUT 900)
# Its case 1795 (f32, logits near 100): cpu's dQ and dK were 1.2x the tolerance while its fp32
# dot products rounded the scores; scores of magnitude 4 and more are now rounded once.
add_test(NAME cli_check_cpu_large_logits_grad
         COMMAND ${_cli} check --dtype f32 --batch 1 --seqlen-q 63 --seqlen-kv 243 --heads 6 --kv-heads 3
                 --head-dim 56 --layout bshd_bs2hd --grad --seed 1001798 --input-scale 6.0614886124310212
                 --backends cpu,reference)
set_tests_properties(cli_check_cpu_large_logits_grad PROPERTIES LABELS cpu TIMEOUT 300)
# The reference backend through the public API next to cpu, on 300 other cases.
add_test(NAME cli_fuzz_reference_cpu_grad
         COMMAND ${_cli} fuzz --cases 300 --grad --backends reference,cpu --seed 12 --require-ran)
set_tests_properties(cli_fuzz_reference_cpu_grad PROPERTIES LABELS cpu TIMEOUT 900)

# The same through plans made without pointers, varlen lengths as cu_seqlens arrays.
add_test(NAME cli_fuzz_cpu_plans_cu_seqlens
         COMMAND ${_cli} fuzz --cases 150 --grad --backends cpu --seed 11 --require-ran --via-plan --cu-seqlens)
set_tests_properties(cli_fuzz_cpu_plans_cu_seqlens PROPERTIES LABELS cpu TIMEOUT 900)

# Training features (docs/semantics.md "Training features"): 300 random cases with softcap,
# dropout, post/pre-scale biases of any broadcast shape, strides and dtype (strided dBias),
# ALiBi, sinks and the max logit, forward and backward, on cpu and the reference's API path,
# every output (max_logit, dbias, d_sinks too) judged against the fp64 reference; the same
# forward only and through plans with cu_seqlens arrays; and one check per option.
add_test(NAME cli_fuzz_features_reference_cpu_grad
         COMMAND ${_cli} fuzz --features --cases 300 --grad --backends reference,cpu --seed 21 --require-ran)
set_tests_properties(cli_fuzz_features_reference_cpu_grad PROPERTIES LABELS cpu TIMEOUT 900)
add_test(NAME cli_fuzz_features_cpu_forward
         COMMAND ${_cli} fuzz --features --cases 300 --backends cpu --seed 22 --require-ran)
set_tests_properties(cli_fuzz_features_cpu_forward PROPERTIES LABELS cpu TIMEOUT 900)
add_test(NAME cli_fuzz_features_cpu_plans_cu_seqlens
         COMMAND ${_cli} fuzz --features --cases 150 --grad --backends cpu --seed 23 --require-ran --via-plan
                 --cu-seqlens)
set_tests_properties(cli_fuzz_features_cpu_plans_cu_seqlens PROPERTIES LABELS cpu TIMEOUT 900)
set(_feature_checks
    "softcap|--softcap 2.5"
    "dropout|--dropout 0.4 --rng-seed 99 --rng-offset 18446744073709551615"
    "bias_post|--bias b:2,1,100,1:1,0,1,0 --bias-type post_scale --bias-dtype bf16"
    "bias_pre|--bias b+9907:1,4,100,100:0,10000,-100,1 --bias-type pre_scale --bias-dtype f16"
    "alibi|--alibi"
    "alibi_per_batch|--alibi-per-batch"
    "sinks|--sinks"
    "max_logit|--max-logit")
foreach(_item ${_feature_checks})
  string(REPLACE "|" ";" _parts "${_item}")
  list(GET _parts 0 _name)
  list(GET _parts 1 _flags)
  separate_arguments(_flags UNIX_COMMAND "${_flags}")
  foreach(_grad "" "--grad")
    set(_tname cli_check_feature_${_name}${_grad})
    string(REPLACE "--grad" "_grad" _tname "${_tname}")
    add_test(NAME ${_tname} COMMAND ${_cli} check --preset small --backends reference,cpu ${_flags} ${_grad} --seed 8)
    set_tests_properties(${_tname} PROPERTIES LABELS cpu TIMEOUT 300
      PASS_REGULAR_EXPRESSION "every compared backend agrees with the fp64 reference")
  endforeach()
endforeach()

# GPU fuzz: skip (exit 77, saying why) without a GPU; with one, a backend that never ran a
# case fails (--require-ran), so these cannot pass vacuously.
add_test(NAME cli_fuzz_cuda_grad
         COMMAND ${_cli} fuzz --cases 2000 --grad --backends cuda --seed 2 --require-gpu --require-ran)
set_tests_properties(cli_fuzz_cuda_grad PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800)
# The training features cuda runs (--features draws only those every listed backend runs:
# softcap, dropout, bias and dBias, ALiBi, sinks, the max logit), forward and backward, every
# output judged.
add_test(NAME cli_fuzz_features_cuda_grad
         COMMAND ${_cli} fuzz --features --cases 2000 --grad --backends cuda --seed 24 --require-gpu --require-ran)
set_tests_properties(cli_fuzz_features_cuda_grad PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800)
# cudnn: at least 2,000 cases that cuDNN runs (it refuses about three in four random
# problems, each with its rule), in four parallel parts: most of the time is graph building,
# which runs on the CPU. NaN/Inf are planted and magnitudes drawn as for the other backends:
# the backend's fix-ups (src/backends/cudnn/nonfinite.hpp) give the definition's NaN where
# cuDNN alone gives the "no key" answer or an infinite gradient, and recompute the backward
# of logits past cuDNN's envelope (docs/backends.md, "Numerical envelope").
foreach(_part 1 2 3 4)
  math(EXPR _seed "2 + ${_part}")
  add_test(NAME cli_fuzz_cudnn_grad_${_part}
           COMMAND ${_cli} fuzz --cases 500 --min-ran 500 --grad --backends cudnn --seed ${_seed}
                   --require-gpu --require-ran)
  set_tests_properties(cli_fuzz_cudnn_grad_${_part} PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800)
endforeach()

# The training features cudnn runs (post-scale bias with dBias, sinks with d_sinks;
# docs/backends.md "cudnn"), drawn at random with the rest of the case: the features it
# does not run are dropped, the shapes and masks cuDNN does not take are refused by rule, and
# 150 cases must run. Finite inputs: the non-finite fix-ups (nonfinite.hpp) find a NaN row by
# cuDNN's stats, which a sink may keep finite (docs/backends.md, "cudnn", sinks).
add_test(NAME cli_fuzz_features_cudnn_grad
         COMMAND ${_cli} fuzz --features --cases 300 --min-ran 150 --grad --backends cudnn --seed 31 --require-gpu
                 --require-ran --finite-inputs)
set_tests_properties(cli_fuzz_features_cudnn_grad PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800)

# cudnn and cuda through plans, varlen cases with cu_seqlens arrays in device memory, which
# both read on the device (cudnn refuses the masks under which a row could see no key).
add_test(NAME cli_fuzz_gpu_plans_cu_seqlens
         COMMAND ${_cli} fuzz --cases 200 --min-ran 60 --grad --backends cudnn,cuda --seed 9 --require-gpu
                 --require-ran --finite-inputs --via-plan --cu-seqlens)
set_tests_properties(cli_fuzz_gpu_plans_cu_seqlens PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800)
# cuda alone through plans with cu_seqlens arrays: every mask and window, NaN/Inf planted.
add_test(NAME cli_fuzz_cuda_plans_cu_seqlens
         COMMAND ${_cli} fuzz --cases 400 --grad --backends cuda --seed 13 --require-gpu --require-ran --via-plan
                 --cu-seqlens)
set_tests_properties(cli_fuzz_cuda_plans_cu_seqlens PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800)

# README.md's CLI block is `strideattn help`'s output, byte for byte (one source: the usage
# text); tools/strideattn/readme_cli.cmake with MODE=update regenerates it.
add_test(NAME cli_help_matches_readme
         COMMAND ${CMAKE_COMMAND} -DCLI=${_cli} -DREADME=${PROJECT_SOURCE_DIR}/README.md -DMODE=check
                 -P ${PROJECT_SOURCE_DIR}/tools/strideattn/readme_cli.cmake)
set_tests_properties(cli_help_matches_readme PROPERTIES LABELS cpu)

# KV-cache attention through the CLI (issue 20): a paged cache with an explicit block table
# that appends across a page boundary, and a contiguous cache of caller-given strided views
# (k and v interleaved in one buffer), each on cpu and the reference's API path, judged
# against the fp64 reference (O, LSE, and the caches after the append).
add_test(NAME cli_check_kvcache_paged
         COMMAND ${_cli} check --cache-seqlens 5,17,0 --page-size 4 --block-table "3,0;5,1,4,2,6;7" --new-tokens 3
                 --seqlen-q 3 --mask causal_bottom_right --backends cpu,reference --seed 4)
set_tests_properties(cli_check_kvcache_paged PROPERTIES LABELS cpu TIMEOUT 300
  PASS_REGULAR_EXPRESSION "every compared backend agrees with the fp64 reference")
add_test(NAME cli_check_kvcache_contiguous
         COMMAND ${_cli} check --cache-seqlens 3,6 --k-cache kv:2,9,2,64:2304,256,128,1
                 --v-cache kv+64:2,9,2,64:2304,256,128,1 --new-tokens 2 --dtype bf16 --backends cpu,reference --seed 5)
set_tests_properties(cli_check_kvcache_contiguous PROPERTIES LABELS cpu TIMEOUT 300
  PASS_REGULAR_EXPRESSION "every compared backend agrees with the fp64 reference")
# A bad block-table entry is refused with exit 2 and a message naming it.
add_test(NAME cli_check_kvcache_bad_block_table
         COMMAND ${_cli} check --cache-seqlens 5 --page-size 4 --block-table "0,99" --backends cpu)
set_tests_properties(cli_check_kvcache_bad_block_table PROPERTIES LABELS cpu TIMEOUT 60
  PASS_REGULAR_EXPRESSION "block_table\\[0, 1\\] is 99")
# 1,000 random KV-cache cases (paged with page sizes 1 .. 256 and every table kind, or
# contiguous; appends, padded rows, masks, windows) on cpu and the reference's API path.
add_test(NAME cli_fuzz_kvcache_reference_cpu
         COMMAND ${_cli} fuzz --kv-cache --cases 1000 --seed 2 --backends cpu,reference)
set_tests_properties(cli_fuzz_kvcache_reference_cpu PROPERTIES LABELS cpu TIMEOUT 600)
# The cuda KV-cache kernels on at least 2,000 random paged cases (f16 / bf16: the f32 cases
# it refuses are drawn past --cases until 2,000 ran; the decode kernels, and the dense forward
# for the quarter of them with 64..160 query rows), on device copies of the buffers; skips
# (77) without a GPU, fails if cuda ran fewer.
add_test(NAME cli_fuzz_kvcache_cuda_paged
         COMMAND ${_cli} fuzz --kv-cache --paged --cases 2000 --min-ran 2000 --seed 3 --backends cuda
                 --require-gpu --require-ran)
set_tests_properties(cli_fuzz_kvcache_cuda_paged PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800)
# The cudnn backend's KV-cache graphs on at least 500 random paged cases (it refuses f32, rows
# not 16-byte aligned and causal with a window, each by name; those are drawn past --cases),
# on device copies of the buffers; skips (77) without a GPU, fails if cudnn ran fewer.
add_test(NAME cli_fuzz_kvcache_cudnn_paged
         COMMAND ${_cli} fuzz --kv-cache --paged --cases 1000 --min-ran 500 --seed 4 --backends cudnn
                 --require-gpu --require-ran)
set_tests_properties(cli_fuzz_kvcache_cudnn_paged PROPERTIES LABELS gpu SKIP_RETURN_CODE 77 TIMEOUT 1800)

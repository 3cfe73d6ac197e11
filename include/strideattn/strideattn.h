/* strideattn C ABI: plain C for FFI (ctypes, cffi, Rust, Julia, ...), the shape of an
 * nvte_*-style API but with strides. Every tensor is a pointer plus 64-bit element strides
 * for each logical dimension [batch, seq, head, dim]; nothing derives a stride from a layout
 * name. Built into the shared library libstrideattn_c.so (only sa_* symbols exported).
 *
 * Conventions:
 *  - Argument structs start with `struct_size`: set it to sizeof(the struct) you compiled
 *    against. Fields are only ever appended; an older caller's shorter struct gets defaults
 *    for the fields it lacks, a newer caller's longer struct is accepted when the fields this
 *    library does not know are zero and it is at most 32 bytes longer than this library's
 *    struct (a larger struct_size is refused before any byte past the struct is read).
 *  - A zero-filled struct (plus struct_size) means every default: no mask, no window, the
 *    default scale 1/sqrt(d_qk), automatic backend, host memory, no varlen, no LSE.
 *  - Calls return an sa_status code; `msg` (may be NULL) receives one NUL-terminated line,
 *    truncated to msg_len - 1 bytes, saying what was wrong ("" on success).
 *  - Nothing is printed (unless STRIDEATTN_LOG is set) and nothing aborts or throws.
 */
#ifndef STRIDEATTN_STRIDEATTN_H_
#define STRIDEATTN_STRIDEATTN_H_

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SA_API __declspec(dllexport)
#else
#define SA_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes (values of strideattn::StatusCode). */
enum sa_status {
  SA_OK = 0,
  SA_INVALID_ARGUMENT = 1, /* the input breaks a rule of the contract */
  SA_UNSUPPORTED = 2,      /* valid input the chosen backend cannot run (message says why) */
  SA_BACKEND_ERROR = 3,    /* a backend failed at run time (CUDA/cuDNN error, out of memory) */
  SA_INTERNAL = 4,
  SA_CANCELLED = 5 /* the caller's cancel flag stopped the call; outputs are incomplete */
};

enum sa_dtype { SA_F16 = 0, SA_BF16 = 1, SA_F32 = 2 };

enum sa_mask {
  SA_MASK_NONE = 0,
  SA_MASK_CAUSAL = 1,             /* top-left aligned: key j visible from query i iff j <= i */
  SA_MASK_CAUSAL_BOTTOM_RIGHT = 2 /* j <= i + s_kv - s_q */
};

enum sa_backend {
  SA_BACKEND_AUTO = 0, /* STRIDEATTN_BACKEND overrides it */
  SA_BACKEND_REFERENCE = 1,
  SA_BACKEND_CPU = 2,
  SA_BACKEND_CUDA = 3,
  SA_BACKEND_CUDNN = 4
};

enum sa_memory { SA_MEMORY_HOST = 0, SA_MEMORY_DEVICE = 1 };

/* A strided tensor: logical shape [b, s, h, d] (varlen: b = 1, s counts tokens), strides
 * in elements. Strides may be negative (reversed views); the head-dim stride must be 1 or
 * -1 (cuda and cudnn take 1 only); size-1 dims may carry any stride. */
typedef struct sa_tensor_view {
  void* data;
  int32_t dtype; /* enum sa_dtype */
  int64_t shape[4];
  int64_t stride[4];
} sa_tensor_view;

/* Log-sum-exp per attention row, fp32, natural log; logical [b, h, s_q] (varlen: [1, h,
 * tokens_q]). data == NULL: forward does not write it (backward requires it). */
typedef struct sa_lse_view {
  float* data;
  int64_t shape[3];
  int64_t stride[3];
} sa_lse_view;

/* Varlen (THD), host memory: `count` sequences (0: dense problem). Sequence i has
 * seqlens_q[i] query tokens starting at token offsets_q[i] of q's seq dimension (and
 * likewise for kv). offsets_q / offsets_kv may be NULL: packed back to back. */
typedef struct sa_varlen {
  int64_t count;
  const int64_t* seqlens_q;
  const int64_t* seqlens_kv;
  const int64_t* offsets_q;
  const int64_t* offsets_kv;
} sa_varlen;

/* Options shared by forward and backward. */
typedef struct sa_options {
  int32_t mask;          /* enum sa_mask */
  int32_t has_window;    /* 0: no sliding window (window_left/right ignored) */
  int64_t window_left;   /* query i sees keys i + s_kv - s_q - left ..            */
  int64_t window_right;  /* .. i + s_kv - s_q + right; -1 = unbounded on that side */
  double scale;          /* 0: default 1/sqrt(d_qk) */
  int32_t deterministic; /* backward: bitwise reproducible run to run */
} sa_options;

/* Varlen lengths as cu_seqlens arrays (FlashAttention's and TransformerEngine's form; see
 * docs/semantics.md): int32 arrays in the tensors' memory (device memory for GPU backends),
 * read by the backend when the call runs. count sequences (0: not used); cu_seqlens_q has
 * count + 1 entries (sequence i has cu_seqlens_q[i + 1] - cu_seqlens_q[i] tokens), seq_offsets_q
 * (optional, NULL: cu_seqlens_q) the first token of each; max_seqlen_q / kv bound every length.
 * Appended to the argument structs; give either this or sa_varlen, not both. */
typedef struct sa_cu_seqlens {
  int64_t count;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_kv;
  const int32_t* seq_offsets_q;
  const int32_t* seq_offsets_kv;
  int64_t max_seqlen_q;
  int64_t max_seqlen_kv;
} sa_cu_seqlens;

/* Training features (docs/semantics.md "Training features"), appended to the argument structs. */
enum sa_bias_type { SA_BIAS_NONE = 0, SA_BIAS_POST_SCALE = 1, SA_BIAS_PRE_SCALE = 2 };

/* A bias or its gradient: logical [b or 1, h or 1, s_q or 1, s_kv or 1], any strides, f32/f16/bf16. */
typedef struct sa_bias_view {
  void* data;
  int32_t dtype; /* enum sa_dtype */
  int64_t shape[4];
  int64_t stride[4];
} sa_bias_view;

/* An fp32 [rows, h] table: ALiBi slopes (rows b or 1), sinks and d_sinks (1), max logit (b).
 * data == NULL: not used. */
typedef struct sa_head_view {
  float* data;
  int64_t shape[2];
  int64_t stride[2];
} sa_head_view;

typedef struct sa_features {
  double softcap;   /* > 0: logits become softcap * tanh(logit / softcap); 0: off */
  double dropout_p; /* 0 <= p < 1; 0: no dropout */
  uint64_t dropout_seed, dropout_offset;
  const uint64_t* dropout_seed_ptr; /* when set, read when the call runs instead of the value */
  const uint64_t* dropout_offset_ptr;
  int32_t bias_type; /* enum sa_bias_type */
  sa_bias_view bias;
  sa_head_view alibi_slopes;
  sa_head_view sinks;
} sa_features;

typedef struct sa_forward_args {
  size_t struct_size;     /* sizeof(sa_forward_args) */
  sa_tensor_view q, k, v; /* [b,s_q,h,d_qk], [b,s_kv,hg,d_qk], [b,s_kv,hg,d_v] */
  sa_tensor_view o;       /* [b,s_q,h,d_v], written */
  sa_lse_view lse;        /* optional output */
  sa_options options;
  sa_varlen varlen;
  int32_t backend; /* enum sa_backend */
  int32_t memory;  /* enum sa_memory */
  void* stream;    /* cudaStream_t for GPU backends */
  void* workspace; /* optional, see sa_workspace_size; NULL: the library allocates */
  size_t workspace_bytes;
  /* Appended fields (absent from older callers' structs, which get the defaults). */
  const void* cancel;       /* NULL, or an atomic_bool (C11 <stdatomic.h>; std::atomic<bool> in C++)
                               that another thread sets to true to stop a host-backend call: it
                               then returns SA_CANCELLED within milliseconds. GPU backends ignore it. */
  sa_cu_seqlens cu_seqlens; /* appended: varlen lengths as cu_seqlens arrays */
  sa_features features;     /* appended: training features */
  sa_head_view max_logit;   /* appended: [b, h] fp32 output, written when data is set */
} sa_forward_args;

typedef struct sa_backward_args {
  size_t struct_size;             /* sizeof(sa_backward_args) */
  sa_tensor_view q, k, v, o, d_o; /* inputs; o is the forward's output */
  sa_lse_view lse;                /* required input: the forward's LSE */
  sa_tensor_view dq, dk, dv;      /* written; dk, dv summed over each GQA group */
  sa_options options;
  sa_varlen varlen;
  int32_t backend;
  int32_t memory;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
  const void* cancel;       /* NULL, or an atomic_bool (C11 <stdatomic.h>; std::atomic<bool> in C++)
                               that another thread sets to true to stop a host-backend call: it
                               then returns SA_CANCELLED within milliseconds. GPU backends ignore it. */
  sa_cu_seqlens cu_seqlens; /* appended: varlen lengths as cu_seqlens arrays */
  sa_features features;     /* appended: training features, as the forward had them */
  sa_bias_view dbias;       /* appended: the bias's shape, written when data is set */
  sa_head_view d_sinks;     /* appended: [1, h] fp32, written when data is set */
} sa_backward_args;

SA_API int sa_forward(const sa_forward_args* args, char* msg, size_t msg_len);
SA_API int sa_backward(const sa_backward_args* args, char* msg, size_t msg_len);

/* Bytes of scratch the backend that would run needs. A workspace must start 16-byte aligned. */
SA_API int sa_workspace_size(const sa_forward_args* args, size_t* bytes, char* msg, size_t msg_len);
SA_API int sa_backward_workspace_size(const sa_backward_args* args, size_t* bytes, char* msg, size_t msg_len);

/* Writes a text explanation (NUL-terminated, truncated to len - 1 bytes): the layout
 * description, then one line per backend with its verdict and reason, then the backend
 * `auto` would run. Returns the validation status (SA_OK when the input is valid). */
SA_API int sa_explain(const sa_forward_args* args, char* buf, size_t len);
SA_API int sa_explain_backward(const sa_backward_args* args, char* buf, size_t len);

/* Plans: made once from a problem (validation, backend choice, the backend's preparation,
 * the workspace size), run many times with new pointers and a stream. In the arguments of
 * sa_plan_create a NULL data pointer is given at run time (the plan then assumes it 16-byte
 * aligned); a forward plan writes LSE when lse.data is set or lse.shape is not all zero. A
 * run gives every data pointer (and lse iff the plan writes it), the stream, the workspace
 * (at least sa_plan_workspace_size bytes, 16-byte aligned; NULL: the library allocates) and,
 * for a cu_seqlens plan, the arrays; it checks what depends on them (null, alignment against
 * the plan's, overlap, memory kind) with an error naming the tensor. A plan may run on several
 * threads at once. */
typedef struct sa_plan sa_plan;

typedef struct sa_forward_run {
  size_t struct_size; /* sizeof(sa_forward_run) */
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_kv;
  const int32_t* seq_offsets_q;
  const int32_t* seq_offsets_kv;
  const void* cancel;
  /* Appended: the training features' tensors (given iff the plan uses them) and the dropout
   * seed and offset (each run's; the pointers as in sa_features). */
  const void* bias;
  const float* alibi_slopes;
  const float* sinks;
  float* max_logit;
  uint64_t dropout_seed, dropout_offset;
  const uint64_t* dropout_seed_ptr;
  const uint64_t* dropout_offset_ptr;
} sa_forward_run;

typedef struct sa_backward_run {
  size_t struct_size; /* sizeof(sa_backward_run) */
  const void* q;
  const void* k;
  const void* v;
  const void* o;
  const void* d_o;
  const float* lse;
  void* dq;
  void* dk;
  void* dv;
  void* stream;
  void* workspace;
  size_t workspace_bytes;
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_kv;
  const int32_t* seq_offsets_q;
  const int32_t* seq_offsets_kv;
  const void* cancel;
  const void* bias; /* appended: as in sa_forward_run */
  const float* alibi_slopes;
  const float* sinks;
  void* dbias;
  float* d_sinks;
  uint64_t dropout_seed, dropout_offset;
  const uint64_t* dropout_seed_ptr;
  const uint64_t* dropout_offset_ptr;
} sa_backward_run;

/* *plan receives a new plan (NULL on failure); free it with sa_plan_destroy. */
SA_API int sa_plan_create(const sa_forward_args* args, sa_plan** plan, char* msg, size_t msg_len);
SA_API int sa_plan_create_backward(const sa_backward_args* args, sa_plan** plan, char* msg, size_t msg_len);
SA_API int sa_plan_run(const sa_plan* plan, const sa_forward_run* run, char* msg, size_t msg_len);
SA_API int sa_plan_run_backward(const sa_plan* plan, const sa_backward_run* run, char* msg, size_t msg_len);
/* Workspace bytes a run needs; the backend that runs it (enum sa_backend; -1 for NULL); 1 for a
 * backward plan, 0 for a forward one; the one-line reason for the backend (NUL-terminated,
 * truncated to len - 1 bytes; returns SA_OK, or SA_INVALID_ARGUMENT for NULL). */
SA_API int sa_plan_workspace_size(const sa_plan* plan, size_t* bytes, char* msg, size_t msg_len);
SA_API int32_t sa_plan_backend(const sa_plan* plan);
SA_API int32_t sa_plan_is_backward(const sa_plan* plan);
SA_API int sa_plan_reason(const sa_plan* plan, char* buf, size_t len);
SA_API void sa_plan_destroy(sa_plan* plan);

/* The library version ("0.1.0"); whether a backend is compiled in (1) or not (0). */
SA_API const char* sa_version(void);
SA_API int sa_backend_compiled(int32_t backend);
/* "ok", "invalid_argument", ... for an sa_status value. */
SA_API const char* sa_status_name(int status);

/* KV-cache attention (inference; docs/semantics.md "KV cache"): queries against a K/V cache,
 * contiguous [b, s_max, hg, d] (block_table.data NULL) or paged [num_pages, page_size, hg, d]
 * (page_size 1..256) with an int32 block table [b, max_pages], token t of sequence n at
 * cache[block_table[n, t / page_size], t % page_size]. cache_seqlens (int32 [b], required) and
 * seqlens_q (int32 [b], optional: rows each sequence uses) are read from the tensors' memory
 * when the call runs. k_new / v_new ([b, s_new, hg, d]; data NULL and shape 0: none) are
 * written into the caches at tokens cache_seqlens[n] .. + s_new - 1, then attended to; the
 * attended length is cache_seqlens + s_new and cache_seqlens is not updated. Masks and windows
 * are relative to the attended length. Forward only. */
typedef struct sa_block_table_view {
  const int32_t* data;
  int64_t shape[2];  /* b, max_pages */
  int64_t stride[2]; /* in elements */
} sa_block_table_view;

typedef struct sa_kvcache_args {
  size_t struct_size; /* sizeof(sa_kvcache_args) */
  sa_tensor_view q;   /* [b, s_q, h, d_qk] */
  sa_tensor_view k_cache, v_cache;
  sa_tensor_view k_new, v_new; /* optional new tokens, both or neither */
  sa_block_table_view block_table;
  const int32_t* cache_seqlens;
  const int32_t* seqlens_q;
  sa_tensor_view o; /* [b, s_q, h, d_v], written */
  sa_lse_view lse;  /* optional output [b, h, s_q] */
  sa_options options;
  int32_t backend; /* enum sa_backend: reference, cpu, cuda and cudnn run it */
  int32_t memory;  /* enum sa_memory */
  void* stream;
  void* workspace;
  size_t workspace_bytes;
  const void* cancel; /* as in sa_forward_args */
} sa_kvcache_args;

SA_API int sa_forward_with_kvcache(const sa_kvcache_args* args, char* msg, size_t msg_len);
SA_API int sa_explain_kvcache(const sa_kvcache_args* args, char* buf, size_t len);
/* Bytes of scratch sa_forward_with_kvcache needs on the backend that would run it (0: none);
 * that much as `workspace` (16-byte aligned) and the call allocates nothing. The workspace
 * fields and where the pointers live are ignored; lengths and block table are not read. */
SA_API int sa_kvcache_workspace_size(const sa_kvcache_args* args, size_t* bytes, char* msg, size_t msg_len);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* STRIDEATTN_STRIDEATTN_H_ */

// read_cu_seqlens (cu_seqlens.hpp): host arrays -> the problem's varlen lists, checked.
#include "problem/cu_seqlens.hpp"

#include <string>

#include "problem/validate.hpp"

namespace strideattn::detail {

namespace {

Status read_side(const char* side, const char* tensor, const std::int32_t* cu, const std::int32_t* first,
                 std::int64_t count, std::int64_t bound, std::int64_t tokens, std::vector<std::int64_t>* lens,
                 std::vector<std::int64_t>* offs) {
  const std::string cu_name = std::string("cu_seqlens_") + side;
  const std::string off_name = first ? std::string("seq_offsets_") + side : cu_name;
  lens->resize(std::size_t(count));
  offs->resize(std::size_t(count));
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t len = std::int64_t(cu[i + 1]) - std::int64_t(cu[i]);
    if (len < 0)
      return Status(StatusCode::invalid_argument,
                    "varlen: " + cu_name + "[" + std::to_string(i + 1) + "] = " + std::to_string(cu[i + 1]) +
                        " is below " + cu_name + "[" + std::to_string(i) + "] = " + std::to_string(cu[i]) +
                        "; supported: non-decreasing prefix sums of the sequence lengths");
    if (len > bound)
      return Status(StatusCode::invalid_argument,
                    "varlen: sequence " + std::to_string(i) + " has " + std::to_string(len) + " tokens (" + cu_name +
                        "[" + std::to_string(i + 1) + "] - " + cu_name + "[" + std::to_string(i) +
                        "]) but max_seqlen_" + side + " is " + std::to_string(bound) +
                        "; supported: every length <= max_seqlen_" + side);
    (*lens)[std::size_t(i)] = len;
    (*offs)[std::size_t(i)] = first ? first[i] : cu[i];
  }
  return check_varlen_side(side, tensor, *lens, *offs, tokens, "lengths from " + cu_name, off_name);
}

}  // namespace

Status read_cu_seqlens(Problem* p) {
  if (Status s = read_side("q", "q", p->cu_seqlens_q, p->seq_offsets_q, p->batch, p->s_q, p->q.shape[kSeq],
                           &p->seqlens_q, &p->offsets_q);
      !s.ok())
    return s;
  return read_side("kv", "k", p->cu_seqlens_kv, p->seq_offsets_kv, p->batch, p->s_kv, p->k.shape[kSeq], &p->seqlens_kv,
                   &p->offsets_kv);
}

}  // namespace strideattn::detail

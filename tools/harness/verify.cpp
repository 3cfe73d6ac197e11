// Verification of one backend's outputs (verify.hpp): element names for failure messages,
// the per-output comparison with the reference under the correctness rule, the
// written/guard verdicts, and the planted-error test hook.
#include "harness/verify.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "common/dtype.hpp"

namespace strideattn::harness::internal {

namespace {

// "o[b=0,s=17,h=3,d=5]" for the logical row-major index of a tensor's view.
std::string element_name(const std::string& tensor, const ViewSpec& v, std::int64_t index, bool varlen) {
  if (index < 0) return tensor;
  std::int64_t idx[4];
  std::int64_t rest = index;
  for (int i = 3; i >= 0; --i) {
    const std::int64_t n = std::max<std::int64_t>(v.shape[i], 1);
    idx[i] = rest % n;
    rest /= n;
  }
  std::ostringstream os;
  if (tensor == "max_logit" || tensor == "d_sinks")  // [rows, h] tables
    os << tensor << "[" << (tensor == "max_logit" ? "b=" : "row=") << idx[0] << ",h=" << idx[1] << "]";
  else if (tensor == "dbias")
    os << "dbias[b=" << idx[0] << ",h=" << idx[1] << ",i=" << idx[2] << ",j=" << idx[3] << "]";
  else if (tensor == "lse")
    os << "lse[b=" << idx[0] << ",h=" << idx[1] << (varlen ? ",t=" : ",s=") << idx[2] << "]";
  else
    os << tensor << "[b=" << idx[0] << (varlen ? ",t=" : ",s=") << idx[1] << ",h=" << idx[2] << ",d=" << idx[3] << "]";
  return os.str();
}

std::string describe_failure(const TensorCheck& c, const ViewSpec& v, bool varlen) {
  const double tol = c.excess >= 0 ? c.err.worst_tol : c.tol;
  std::string s = element_name(c.name, v, c.err.worst_index, varlen) + " = " + fmt(c.err.worst_value) + " vs " +
                  fmt(c.err.worst_expected) + " (tol " + fmt(tol) + (tol > c.tol ? ", conditioning" : "") + ")";
  if (c.err.non_finite > 0)
    s = c.name + ": " + std::to_string(c.err.non_finite) +
        " non-finite value(s) where the reference is finite (or vice versa); worst " + s;
  return s;
}

}  // namespace

void check_outputs(const BufferSet& bufs, const std::vector<Expected>& expected, bool varlen, bool inputs_non_finite,
                   BackendResult* r, std::vector<std::string>* failures) {
  for (const Expected& e : expected) {
    const DType stored = bufs.at(e.view->buffer).dtype();  // LSE and the head tables: f32
    TensorCheck c = check_tensor(e.name, stored, read_view(bufs.at(e.view->buffer), *e.view), *e.naive, *e.exact,
                                 e.magnitude, inputs_non_finite, e.terms);
    if (!c.pass()) failures->push_back(describe_failure(c, *e.view, varlen));
    r->checks.push_back(std::move(c));
  }
}

void apply_run_check(const BufferSet::CheckResult& ck, const char* phase, BackendResult* r,
                     std::vector<std::string>* failures) {
  if (!ck.written_ok) {
    r->written_ok = false;
    failures->push_back(std::string(phase) + ": " + ck.written_msg);
  }
  if (!ck.guard_ok) {
    r->guard_ok = false;
    failures->push_back(std::string(phase) + ": " + ck.guard_msg);
  }
}

bool inputs_non_finite(const CaseSpec& spec) {
  return std::any_of(spec.input_plants.begin(), spec.input_plants.end(),
                     [](const CaseSpec::InputPlant& pl) { return !std::isfinite(pl.value); });
}

void apply_plant(const CaseSpec& spec, Prepared& p, const std::vector<std::string>& phase) {
  if (!spec.plant) return;
  const CaseSpec::Plant& pl = *spec.plant;
  if (std::find(phase.begin(), phase.end(), pl.tensor) == phase.end()) return;
  const ViewSpec* v = pl.tensor == "o"           ? p.cv.o
                      : pl.tensor == "lse"       ? &p.cv.lse
                      : pl.tensor == "dq"        ? p.cv.dq
                      : pl.tensor == "dk"        ? p.cv.dk
                      : pl.tensor == "max_logit" ? &p.cv.max_logit
                      : pl.tensor == "dbias"     ? &p.cv.dbias
                      : pl.tensor == "d_sinks"   ? &p.cv.d_sinks
                                                 : p.cv.dv;
  if (v->buffer.empty()) return;  // a feature the case does not use
  HostBuffer& buf = p.bufs.at(v->buffer);
  const std::vector<std::int64_t> offs = view_offsets(*v);
  if (offs.empty()) return;
  const std::int64_t at = offs[std::size_t(std::clamp<std::int64_t>(pl.index, 0, std::int64_t(offs.size()) - 1))];
  if (pl.kind == "value") {
    const float x = detail::load_as_float(buf.data(), buf.dtype(), at);
    detail::store_from_float(buf.data(), buf.dtype(), at, float(x + pl.delta));
  } else if (pl.kind == "ulps") {  // delta units in the last place of the stored value
    const float x = detail::load_as_float(buf.data(), buf.dtype(), at);
    const int bits = buf.dtype() == DType::f32 ? 23 : buf.dtype() == DType::f16 ? 10 : 7;
    const double ulp = x == 0 ? 0.0 : std::ldexp(1.0, std::ilogb(x) - bits);
    detail::store_from_float(buf.data(), buf.dtype(), at, float(double(x) + pl.delta * ulp));
  } else if (pl.kind == "unwritten") {
    buf.set_bits(at, poison_bits(buf.dtype()));
  } else if (pl.kind == "guard") {
    buf.set_bits(buf.extent(), buf.bits(buf.extent()) ^ 1u);
  }
}

}  // namespace strideattn::harness::internal

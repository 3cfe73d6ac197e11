// Host buffers with guard bands, random fill, poisoning and the written/guard checks.
#include "harness/buffers.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>

#include "common/dtype.hpp"
#include "harness/checked.hpp"

namespace strideattn::harness {

namespace {

std::uint64_t mix(std::uint64_t seed, const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the name, then splitmix
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + h;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::uint32_t float_bits_in(DType dtype, float x) {
  switch (dtype) {
    case DType::f32:
      return detail::float_to_bits(x);
    case DType::f16:
      return detail::float_to_f16(x);
    case DType::bf16:
      return detail::float_to_bf16(x);
  }
  return 0;
}

}  // namespace

std::uint32_t poison_bits(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return 0x7e5au;  // quiet NaN, payload 0x25a
    case DType::bf16:
      return 0x7fa5u;  // quiet NaN, payload 0x25
    case DType::f32:
      return 0x7fc5a5a5u;  // quiet NaN, payload 0x45a5a5
  }
  return 0;
}

void HostBuffer::Free::operator()(std::byte* p) const { std::free(p); }

HostBuffer::HostBuffer(std::string name, DType dtype, std::int64_t extent)
    : name_(std::move(name)), dtype_(dtype), extent_(std::max<std::int64_t>(extent, 0)) {
  // The runner bounds every extent first (2^33 elements); this keeps the byte count exact.
  if (extent_ > (std::int64_t(1) << 40))
    throw std::length_error("buffer '" + name_ + "' of " + std::to_string(extent_) +
                            " elements is larger than the harness allocates");
  const std::size_t bytes = (total_bytes() + 255) / 256 * 256;
  storage_.reset(static_cast<std::byte*>(std::aligned_alloc(256, bytes)));
  if (!storage_) throw std::bad_alloc();
  std::memset(storage_.get(), 0, bytes);
}

std::size_t HostBuffer::total_bytes() const { return std::size_t(total_elems()) * size_of(dtype_); }

void* HostBuffer::data() { return storage_.get() + kGuardElems * size_of(dtype_); }
const void* HostBuffer::data() const { return storage_.get() + kGuardElems * size_of(dtype_); }

std::uint32_t HostBuffer::bits(std::int64_t i) const {
  const std::byte* p = storage_.get() + (i + kGuardElems) * std::int64_t(size_of(dtype_));
  if (dtype_ == DType::f32) {
    std::uint32_t u;
    std::memcpy(&u, p, 4);
    return u;
  }
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

void HostBuffer::set_bits(std::int64_t i, std::uint32_t bits) {
  std::byte* p = storage_.get() + (i + kGuardElems) * std::int64_t(size_of(dtype_));
  if (dtype_ == DType::f32) {
    std::memcpy(p, &bits, 4);
  } else {
    const std::uint16_t h = std::uint16_t(bits);
    std::memcpy(p, &h, 2);
  }
}

void HostBuffer::fill_random(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (std::int64_t i = -kGuardElems; i < extent_ + kGuardElems; ++i) {
    float x = normal(rng);
    if (x == 0.f) x = 0.5f;  // never zeros
    set_bits(i, float_bits_in(dtype_, x));
  }
}

void HostBuffer::fill_bits(std::uint32_t b) {
  for (std::int64_t i = -kGuardElems; i < extent_ + kGuardElems; ++i) set_bits(i, b);
}

std::vector<std::int64_t> view_offsets(const ViewSpec& v) {
  std::vector<std::int64_t> out;
  for (std::int64_t n : v.shape)
    if (n <= 0) return out;
  const std::optional<std::int64_t> n = checked_product({v.shape[0], v.shape[1], v.shape[2], v.shape[3]});
  if (!n) throw std::length_error("view " + format_view(v) + " has more than 2^63 - 1 elements");
  out.reserve(std::size_t(*n));
  for (std::int64_t b = 0; b < v.shape[0]; ++b)
    for (std::int64_t s = 0; s < v.shape[1]; ++s)
      for (std::int64_t h = 0; h < v.shape[2]; ++h) {
        const std::int64_t row = v.offset + b * v.stride[0] + s * v.stride[1] + h * v.stride[2];
        for (std::int64_t d = 0; d < v.shape[3]; ++d) out.push_back(row + d * v.stride[3]);
      }
  return out;
}

std::vector<double> read_view(const HostBuffer& buf, const ViewSpec& view) {
  std::vector<double> out;
  const std::vector<std::int64_t> offs = view_offsets(view);
  out.reserve(offs.size());
  for (std::int64_t o : offs) out.push_back(detail::load_as_float(buf.data(), buf.dtype(), o));
  return out;
}

void BufferSet::allocate(const std::vector<const ViewSpec*>& views, DType dtype) {
  std::map<std::string, std::int64_t> extent;
  for (const ViewSpec* v : views) {
    std::int64_t& e = extent[v->buffer];
    e = std::max(e, required_extent(*v));
  }
  for (const auto& [name, e] : extent) buffers_.try_emplace(name, name, dtype, e);
}

void BufferSet::allocate_named(const std::string& name, DType dtype, std::int64_t extent) {
  buffers_.insert_or_assign(name, HostBuffer(name, dtype, extent));
}

void BufferSet::fill_random(std::uint64_t seed) {
  for (auto& [name, buf] : buffers_) buf.fill_random(mix(seed, name));
}

void BufferSet::prepare_outputs(const std::vector<const ViewSpec*>& views,
                                const std::vector<std::string>& whole_output_buffers,
                                const std::vector<const ViewSpec*>& input_views) {
  output_mask_.clear();
  for (auto& [name, buf] : buffers_) output_mask_[name].assign(std::size_t(buf.total_elems()), 0);
  for (const std::string& name : whole_output_buffers) {
    HostBuffer& buf = buffers_.at(name);
    std::vector<std::uint8_t>& m = output_mask_[name];
    for (std::int64_t i = 0; i < buf.extent(); ++i) m[std::size_t(i + kGuardElems)] = 1;
    buf.fill_bits(poison_bits(buf.dtype()));
  }
  std::map<std::string, bool> has_input;
  for (const ViewSpec* v : input_views) has_input[v->buffer] = true;
  for (const ViewSpec* v : views) {
    HostBuffer& buf = buffers_.at(v->buffer);
    std::vector<std::uint8_t>& m = output_mask_[v->buffer];
    if (!has_input[v->buffer]) buf.fill_bits(poison_bits(buf.dtype()));
    for (std::int64_t o : view_offsets(*v)) {
      m[std::size_t(o + kGuardElems)] = 1;
      buf.set_bits(o, poison_bits(buf.dtype()));
    }
  }
  snapshot_ = save();
}

BufferSet::CheckResult BufferSet::check_after_run() const {
  CheckResult r;
  for (const auto& [name, buf] : buffers_) {
    const std::vector<std::uint8_t>& m = output_mask_.at(name);
    const std::vector<std::byte>& snap = snapshot_.at(name);
    const std::uint32_t poison = poison_bits(buf.dtype());
    const std::size_t es = size_of(buf.dtype());
    std::int64_t unwritten = 0, changed = 0, first_unwritten = 0, first_changed = 0;
    for (std::int64_t i = -kGuardElems; i < buf.extent() + kGuardElems; ++i) {
      const std::size_t k = std::size_t(i + kGuardElems);
      if (m[k]) {
        if (buf.bits(i) == poison && unwritten++ == 0) first_unwritten = i;
      } else if (std::memcmp(buf.raw() + k * es, snap.data() + k * es, es) != 0) {
        if (changed++ == 0) first_changed = i;
      }
    }
    if (unwritten && r.written_ok) {
      r.written_ok = false;
      std::ostringstream os;
      os << unwritten << " output element(s) of buffer '" << name << "' not written (first: element " << first_unwritten
         << ")";
      r.written_msg = os.str();
    }
    if (changed && r.guard_ok) {
      r.guard_ok = false;
      std::ostringstream os;
      os << changed << " element(s) of buffer '" << name << "' outside the output views changed (first: element "
         << first_changed;
      if (first_changed < 0)
        os << ", in the front guard band";
      else if (first_changed >= buf.extent())
        os << ", in the back guard band";
      os << ")";
      r.guard_msg = os.str();
    }
  }
  return r;
}

std::map<std::string, std::vector<std::byte>> BufferSet::save() const {
  std::map<std::string, std::vector<std::byte>> out;
  for (const auto& [name, buf] : buffers_) out[name].assign(buf.raw(), buf.raw() + buf.total_bytes());
  return out;
}

void BufferSet::restore(const std::map<std::string, std::vector<std::byte>>& saved) {
  for (auto& [name, buf] : buffers_) {
    const std::vector<std::byte>& s = saved.at(name);
    std::memcpy(buf.raw(), s.data(), std::min(s.size(), buf.total_bytes()));
  }
}

}  // namespace strideattn::harness

// Host buffers for the harness: one allocation per distinct buffer name of a case's views,
// with guard bands on both sides, random fill, output poisoning, the "written" and "guard"
// checks, and reading a view in logical order. Device mirrors live in device_mirror.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/views.hpp"
#include "strideattn/strideattn.hpp"

namespace strideattn::harness {

inline constexpr std::int64_t kGuardElems = 256;  // guard band before and after each buffer

// The NaN bit patterns written into output elements before a run ("not written yet").
[[nodiscard]] std::uint32_t poison_bits(DType dtype);

// One named allocation: [guard | extent elements | guard]. Element 0 of the views is
// `data()`; the guard bands are addressable as elements -kGuardElems .. -1 and
// extent .. extent + kGuardElems - 1.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(std::string name, DType dtype, std::int64_t extent);
  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] DType dtype() const { return dtype_; }
  [[nodiscard]] std::int64_t extent() const { return extent_; }
  [[nodiscard]] std::int64_t total_elems() const { return extent_ + 2 * kGuardElems; }
  [[nodiscard]] std::size_t total_bytes() const;
  [[nodiscard]] std::byte* raw() { return storage_.get(); }  // start of front guard
  [[nodiscard]] const std::byte* raw() const { return storage_.get(); }
  [[nodiscard]] void* data();  // element 0
  [[nodiscard]] const void* data() const;
  // Bits of element i (i may index the guard bands: -kGuardElems <= i < extent + kGuardElems).
  [[nodiscard]] std::uint32_t bits(std::int64_t i) const;
  void set_bits(std::int64_t i, std::uint32_t bits);
  // Fill every element (guards included) with normal(0, 1) values rounded to the dtype.
  void fill_random(std::uint64_t seed);
  void fill_bits(std::uint32_t bits);

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::string name_;
  DType dtype_ = DType::f32;
  std::int64_t extent_ = 0;
  std::unique_ptr<std::byte[], Free> storage_;
};

// Element offsets (from element 0 of the buffer) of every logical element of `view`.
[[nodiscard]] std::vector<std::int64_t> view_offsets(const ViewSpec& view);

// The tensor's values in logical row-major order [b, s, h, d].
[[nodiscard]] std::vector<double> read_view(const HostBuffer& buf, const ViewSpec& view);

// A set of named buffers and which elements of each are outputs of the current run.
class BufferSet {
 public:
  // Allocate one buffer per distinct name over `views` (extent = max required_extent).
  void allocate(const std::vector<const ViewSpec*>& views, DType dtype);
  // An extra buffer (the LSE) with a given extent and dtype.
  void allocate_named(const std::string& name, DType dtype, std::int64_t extent);
  [[nodiscard]] HostBuffer& at(const std::string& name) { return buffers_.at(name); }
  [[nodiscard]] const HostBuffer& at(const std::string& name) const { return buffers_.at(name); }
  [[nodiscard]] std::map<std::string, HostBuffer>& all() { return buffers_; }
  [[nodiscard]] const std::map<std::string, HostBuffer>& all() const { return buffers_; }

  // Random values everywhere; each buffer's stream is derived from `seed` and its name.
  void fill_random(std::uint64_t seed);

  // Mark the elements of `views` as the outputs of the next run, poison them (buffers only
  // outputs name are poisoned entirely, guard bands included), then snapshot every buffer.
  // `extra_outputs` are whole buffers (the LSE) that are outputs.
  void prepare_outputs(const std::vector<const ViewSpec*>& views, const std::vector<std::string>& whole_output_buffers,
                       const std::vector<const ViewSpec*>& input_views);

  struct CheckResult {
    bool written_ok = true, guard_ok = true;
    std::string written_msg, guard_msg;  // first failure, e.g. "o: element 17 (buffer o) ..."
  };
  // After a run: every marked output element non-poison; every other element unchanged.
  [[nodiscard]] CheckResult check_after_run() const;

  // Copy of every buffer's bytes (to restore pristine inputs between backends).
  [[nodiscard]] std::map<std::string, std::vector<std::byte>> save() const;
  void restore(const std::map<std::string, std::vector<std::byte>>& saved);

 private:
  std::map<std::string, HostBuffer> buffers_;
  std::map<std::string, std::vector<std::uint8_t>> output_mask_;  // per element (guards incl.)
  std::map<std::string, std::vector<std::byte>> snapshot_;
};

}  // namespace strideattn::harness

// Downstream use of the installed / add_subdirectory'd library: the seed split of one fused
// [s, b, h + 2hg, d] buffer on the `cpu` backend, O checked against a direct computation of
// one row in double. Exit 0 on agreement; prints what went wrong otherwise. With the argument
// `explain` it also prints every backend's verdict for the problem, one "name: rule: reason"
// line each (tests/packaging/check_install.sh reads the cuda and cudnn ones).
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <strideattn/strideattn.hpp>

int main(int argc, char** argv) {
  using namespace strideattn;
  const std::int64_t s = 37, b = 2, h = 4, hg = 1, d = 16, row = (h + 2 * hg) * d;
  std::vector<float> qkv(std::size_t(s * b * row)), out(std::size_t(s * b * h * d), NAN);
  std::mt19937 gen(20261129);
  std::normal_distribution<float> normal;
  for (float& x : qkv) x = normal(gen);

  ForwardArgs args;
  args.q = {qkv.data(), DType::f32, {b, s, h, d}, {row, b * row, d, 1}};
  args.k = {qkv.data() + h * d, DType::f32, {b, s, hg, d}, {row, b * row, d, 1}};
  args.v = {qkv.data() + (h + hg) * d, DType::f32, {b, s, hg, d}, {row, b * row, d, 1}};
  args.o = {out.data(), DType::f32, {b, s, h, d}, {s * h * d, h * d, d, 1}};
  args.options.mask = MaskKind::causal;
  args.backend = Backend::cpu;
  if (argc > 1 && std::string(argv[1]) == "explain") {
    const Explanation e = explain(args);
    for (const Verdict& v : e.verdicts)
      std::printf("%s: %s: %s\n", std::string(to_string(v.backend)).c_str(), v.supported ? "supported" : v.rule.c_str(),
                  v.reason.c_str());
  }
  if (Status st = forward(args); !st.ok()) {
    std::fprintf(stderr, "forward failed: %s\n", st.message().c_str());
    return 1;
  }
  // Row i = s - 1 of batch 1, head 2: softmax over keys 0..i of the (only) KV head.
  const std::int64_t bi = 1, i = s - 1, hi = 2;
  const float* q = qkv.data() + i * b * row + bi * row + hi * d;
  std::vector<double> p(std::size_t(i + 1));
  double mx = -INFINITY, sum = 0;
  for (std::int64_t j = 0; j <= i; ++j) {
    const float* k = qkv.data() + j * b * row + bi * row + h * d;
    double dot = 0;
    for (std::int64_t x = 0; x < d; ++x) dot += double(q[x]) * k[x];
    p[std::size_t(j)] = dot / std::sqrt(double(d));
    mx = std::max(mx, p[std::size_t(j)]);
  }
  for (double& v : p) sum += (v = std::exp(v - mx));
  double worst = 0;
  for (std::int64_t x = 0; x < d; ++x) {
    double o = 0;
    for (std::int64_t j = 0; j <= i; ++j)
      o += p[std::size_t(j)] / sum * qkv[std::size_t(j * b * row + bi * row + (h + hg) * d + x)];
    worst = std::max(worst, std::fabs(o - out[std::size_t(bi * s * h * d + i * h * d + hi * d + x)]));
  }
  if (!(worst < 1e-4)) {
    std::fprintf(stderr, "O differs from the direct computation by %g\n", worst);
    return 1;
  }
  std::printf("consumer: ok (max error %.2g)\n", worst);
  return 0;
}

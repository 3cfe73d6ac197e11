// Tests of the training-feature options of the `strideattn` CLI (docs/semantics.md "Training
// features"): the harness judges max_logit, dbias and d_sinks and catches an error planted in
// each; bad feature options are one-line errors; a fuzz case drawn with --features parses back
// from its reproducer into the same features.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "harness/runner.hpp"
#include "strideattn/cli_args.hpp"
#include "strideattn/fuzz.hpp"

#ifndef STRIDEATTN_CLI
#error "STRIDEATTN_CLI (path of the built strideattn executable) must be defined"
#endif

namespace strideattn::cli {
namespace {

struct Result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result run_cli(const std::string& args) {
  const std::string base =
      ::testing::TempDir() + "strideattn_clif_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string cmd = std::string("'") + STRIDEATTN_CLI + "' " + args + " >'" + base + ".out' 2>'" + base + ".err'";
  const int st = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

// Every feature at once, with a bias broadcast over batch and heads, and its dBias.
const std::string kAll =
    "check --preset small --backends reference,cpu --grad --softcap 4 --dropout 0.3 --rng-seed 11 "
    "--rng-offset 5 --bias bias+3:1,1,100,100:0,0,101,1 --bias-type pre_scale --bias-dtype f32 --alibi-per-batch "
    "--sinks --max-logit --seed 3";

TEST(CliFeatures, EveryOutputIsJudged) {
  const Result r = run_cli(kAll + " --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["problem"]["features"]["bias_type"], "pre_scale");
  EXPECT_EQ(j["problem"]["features"]["alibi_rows"], 2);
  for (const auto& b : j["backends"]) {
    EXPECT_EQ(b["status"], "ok") << b.dump();
    EXPECT_TRUE(b["max_logit"]["pass"].get<bool>()) << b.dump();
    EXPECT_TRUE(b["grad"]["dbias"]["pass"].get<bool>()) << b.dump();
    EXPECT_TRUE(b["grad"]["d_sinks"]["pass"].get<bool>()) << b.dump();
    EXPECT_GT(b["grad"]["dbias"]["tolerance"].get<double>(), 0);
  }
}

// An error planted in each new output after every backend's run is caught and named.
TEST(CliFeatures, PlantedErrorsInFeatureOutputsAreCaught) {
  struct Plant {
    std::string hook, element;
  };
  for (const Plant& p :
       {Plant{"value:max_logit:3:0.01", "max_logit[b=0,h=3]"}, Plant{"value:dbias:250:0.05", "dbias[b=0,h=0,i=2,j=50]"},
        Plant{"value:d_sinks:1:0.01", "d_sinks[row=0,h=1]"}, Plant{"unwritten:dbias:7:0", "dbias"},
        Plant{"guard:max_logit:0:0", "max_logit"}}) {
    const Result r = run_cli(kAll + " --test-plant " + p.hook);
    EXPECT_EQ(r.code, 1) << p.hook << "\n" << r.out << r.err;
    EXPECT_NE(r.out.find("DISAGREES: reference mismatch"), std::string::npos) << p.hook << "\n" << r.out;
    EXPECT_NE(r.out.find(p.element), std::string::npos) << p.hook << "\n" << r.out;
  }
}

// A fully broadcast dBias (one element summing every pair) still has a tolerance that an
// error of 1% of the gradients' scale exceeds.
TEST(CliFeatures, BroadcastDbiasCatchesAPlantedError) {
  const std::string base =
      "check --preset small --backends cpu --grad --bias b:1,1,1,1:0,0,0,0 --bias-dtype f32 --seed 5 --json";
  const Result ok = run_cli(base);
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  const nlohmann::json j = nlohmann::json::parse(ok.out);
  const double tol = j["backends"][0]["grad"]["dbias"]["tolerance"].get<double>();
  const double allowance = j["backends"][0]["grad"]["dbias"]["max_allowance"].get<double>();
  const double delta = 2 * std::max(tol, allowance) + 1e-3;
  const Result bad = run_cli(base + " --test-plant value:dbias:0:" + std::to_string(delta));
  EXPECT_EQ(bad.code, 1) << bad.out << bad.err;
}

void expect_invalid(const std::string& args, const std::string& mention) {
  const Result r = run_cli(args);
  EXPECT_EQ(r.code, 2) << args << "\n" << r.out << r.err;
  EXPECT_EQ(r.err.rfind("strideattn: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(mention), std::string::npos) << args << ": expected '" << mention << "' in " << r.err;
}

TEST(CliFeatures, BadOptionsAreOneLineErrors) {
  expect_invalid("check --preset small --rng-seed 3", "without --dropout");
  expect_invalid("check --preset small --bias-type pre_scale", "without --bias");
  expect_invalid("check --preset small --bias b:1,1,1,1:0,0,0,0 --bias-type sideways", "post_scale, pre_scale");
  expect_invalid("check --preset small --bias b:1,1,1,1:0,0,0,0 --dbias d:1,1,1,1:0,0,0,0", "--grad");
  expect_invalid("check --preset small --bias b:1,1,1:0,0,0", "b,h,s_q,s_kv");
  expect_invalid("check --preset small --alibi --alibi-per-batch", "give one");
  expect_invalid("check --preset small --dropout 0.5 --rng-seed -1", "unsigned 64-bit");
  // Ranges are the library's rules, with its messages.
  expect_invalid("check --preset small --softcap -1 --backends cpu", "softcap");
  expect_invalid("check --preset small --dropout 1 --backends cpu", "0 <= p < 1");
  expect_invalid("check --preset small --bias b:1,3,1,1:0,1,0,0 --backends cpu", "head extent 3");
  // A bias in Q's buffer must have the case's dtype.
  expect_invalid(
      "check --preset small --layout bshd_bshd_bshd --q q:2,100,4,64:25600,256,64,1 --bias q+0:1,1,1,1:0,0,0,0 "
      "--bias-dtype f32 --backends cpu",
      "buffer 'q'");
}

TEST(CliFeatures, BenchRunsWithFeatures) {
  const Result r = run_cli(
      "bench --preset small --backends cpu --grad --runs 20 --softcap 3 --sinks --bias b:1,4,1,100:0,100,0,1 "
      "--max-logit --dropout 0.1");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}

TEST(Reproducer, FeaturesParseBack) {
  int with_bias = 0, with_dbias = 0, with_dropout = 0;
  for (int i = 0; i < 300; ++i) {
    const harness::CaseSpec spec = random_case(77, i, i % 2 == 0, true, true);
    const std::string line = harness::reproducer(spec, {Backend::cpu});
    std::vector<std::string> words;
    {  // the reproducer quotes only layout names: split on blanks, drop the quotes
      std::istringstream is(line);
      for (std::string w; is >> w;) {
        if (w.size() >= 2 && w.front() == '\'') w = w.substr(1, w.size() - 2);
        words.push_back(w);
      }
    }
    words.erase(words.begin());
    Invocation inv;
    const Status s = parse_command_line(words, &inv);
    ASSERT_TRUE(s.ok()) << line << "\n" << s.message();
    const harness::CaseSpec& got = inv.spec;
    EXPECT_TRUE(spec.any_feature()) << line;
    EXPECT_EQ(got.options.softcap, spec.options.softcap) << line;
    EXPECT_EQ(got.options.dropout.p, spec.options.dropout.p) << line;
    EXPECT_EQ(got.options.dropout.seed, spec.options.dropout.seed) << line;
    EXPECT_EQ(got.options.dropout.offset, spec.options.dropout.offset) << line;
    EXPECT_EQ(got.options.bias_type, spec.options.bias_type) << line;
    ASSERT_EQ(got.features.bias.has_value(), spec.features.bias.has_value()) << line;
    if (spec.features.bias) {
      EXPECT_EQ(harness::format_view(*got.features.bias), harness::format_view(*spec.features.bias)) << line;
      EXPECT_EQ(got.features.bias_dtype, spec.features.bias_dtype) << line;
    }
    ASSERT_EQ(got.features.dbias.has_value(), spec.features.dbias.has_value()) << line;
    if (spec.features.dbias)
      EXPECT_EQ(harness::format_view(*got.features.dbias), harness::format_view(*spec.features.dbias)) << line;
    EXPECT_EQ(got.features.alibi_rows, spec.features.alibi_rows) << line;
    EXPECT_EQ(got.features.sinks, spec.features.sinks) << line;
    EXPECT_EQ(got.features.max_logit, spec.features.max_logit) << line;
    with_bias += spec.features.bias.has_value();
    with_dbias += spec.features.dbias.has_value();
    with_dropout += spec.options.dropout.p > 0;
  }
  EXPECT_GT(with_bias, 50);
  EXPECT_GT(with_dbias, 20);
  EXPECT_GT(with_dropout, 50);
}

// fuzz --features --backends cuda draws what cuda runs (softcap, dropout, bias and dBias,
// ALiBi, sinks, the max logit: every feature), each of them often, as drawn for every
// backend; the rest of each case is the one drawn for every backend.
TEST(FuzzFeatures, DrawsOnlyWhatTheBackendsRun) {
  int softcap = 0, dropout = 0, bias = 0, alibi = 0, sinks = 0, max_logit = 0;
  for (int i = 0; i < 300; ++i) {
    const harness::CaseSpec all = random_case(78, i, true, true, true);
    const harness::CaseSpec spec = random_case(78, i, true, true, true, {Backend::cuda});
    EXPECT_TRUE(spec.any_feature()) << i;
    EXPECT_EQ(spec.options.dropout.p, all.options.dropout.p) << i;
    EXPECT_EQ(spec.options.dropout.seed, all.options.dropout.seed) << i;
    EXPECT_EQ(spec.options.dropout.offset, all.options.dropout.offset) << i;
    EXPECT_EQ(spec.options.bias_type, all.options.bias_type) << i;
    EXPECT_EQ(spec.features.bias.has_value(), all.features.bias.has_value()) << i;
    EXPECT_EQ(spec.features.dbias.has_value(), all.features.dbias.has_value()) << i;
    EXPECT_EQ(spec.options.softcap, all.options.softcap) << i;
    EXPECT_EQ(spec.features.alibi_rows, all.features.alibi_rows) << i;
    EXPECT_EQ(spec.features.sinks, all.features.sinks) << i;
    EXPECT_EQ(spec.sizes.s_q, all.sizes.s_q) << i;
    EXPECT_EQ(harness::format_view(spec.views.q), harness::format_view(all.views.q)) << i;
    dropout += spec.options.dropout.p > 0;
    softcap += spec.options.softcap > 0, alibi += spec.features.alibi_rows > 0, sinks += spec.features.sinks;
    max_logit += spec.features.max_logit, bias += spec.features.bias.has_value();
  }
  EXPECT_GT(softcap, 50);
  EXPECT_GT(dropout, 50);
  EXPECT_GT(bias, 50);
  EXPECT_GT(alibi, 50);
  EXPECT_GT(sinks, 50);
  EXPECT_GT(max_logit, 50);
  // cudnn runs the bias and sinks: its cases ask for those only, and some do.
  int with_features = 0;
  for (std::int64_t i = 0; i < 50; ++i) {
    const harness::CaseSpec c = random_case(78, i, true, true, true, {Backend::cudnn});
    with_features += c.any_feature() ? 1 : 0;
    EXPECT_EQ(c.options.softcap, 0) << i;
    EXPECT_EQ(c.options.dropout.p, 0) << i;
    EXPECT_EQ(c.features.alibi_rows, 0) << i;
    EXPECT_FALSE(c.features.max_logit) << i;
  }
  EXPECT_GT(with_features, 10);
}

}  // namespace
}  // namespace strideattn::cli

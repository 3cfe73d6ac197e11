// Tests of the `strideattn` CLI: the built executable's exit codes, its one-line errors, its
// --json output, and that a fuzz case's reproducer parses back into the same case.
#include <gtest/gtest.h>

#include <cmath>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <stdlib.h>
#include <fstream>
#include <set>
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

// Runs a shell command line, capturing its stdout and stderr.
Result run_shell(const std::string& command) {
  const std::string base =
      ::testing::TempDir() + "strideattn_cli_" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string cmd = command + " >'" + base + ".out' 2>'" + base + ".err'";
  const int st = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

// Runs the CLI with `args` (already shell-quoted where needed), `env` (NAME=value ...) set.
Result run_cli(const std::string& args, const std::string& env = "") {
  return run_shell(env + " '" + STRIDEATTN_CLI + "' " + args);
}

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

void expect_invalid(const std::string& args, const std::string& mention, const std::string& env = "") {
  const Result r = run_cli(args, env);
  EXPECT_EQ(r.code, 2) << args << "\nstdout: " << r.out << "\nstderr: " << r.err;
  EXPECT_EQ(lines(r.err), 1) << args << "\nstderr: " << r.err;
  EXPECT_EQ(r.err.rfind("strideattn: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(mention), std::string::npos)
      << args << ": expected the message to mention '" << mention << "'; got " << r.err;
}

TEST(CliInvalid, UnknownOption) { expect_invalid("check --bogus 3", "--bogus"); }
TEST(CliInvalid, UnknownCommand) { expect_invalid("chekc --preset small", "chekc"); }
TEST(CliInvalid, MissingValue) { expect_invalid("check --heads", "--heads"); }
TEST(CliInvalid, BadViewSyntax) { expect_invalid("check --q q:1,2,3:1,1,1,1", "--q"); }
TEST(CliInvalid, BadViewSyntaxMissingStrides) { expect_invalid("check --k kv+3:1,128,4,64", "--k"); }
TEST(CliInvalid, HeadDimStrideNotOne) {
  expect_invalid("check --q q:1,128,4,64:65536,512,128,2 --backends cpu", "stride");
}
TEST(CliInvalid, HeadsNotMultipleOfKvHeads) { expect_invalid("check --heads 6 --kv-heads 4 --backends cpu", "6"); }
TEST(CliInvalid, WindowBelowMinusOne) { expect_invalid("check --window -2,0 --backends cpu", "-2"); }
TEST(CliInvalid, WindowSyntax) { expect_invalid("check --window 3", "--window"); }
TEST(CliInvalid, OutputOverlapsInput) {
  // Default layout bshd: q lives in buffer 'q' as [1,128,4,64] contiguous; o aliases it.
  expect_invalid("check --o q:1,128,4,64:32768,256,64,1 --backends cpu", "overlap");
}
TEST(CliInvalid, VarlenPastEnd) {
  expect_invalid("check --seqlens-q 10,20 --q q:1,25,4,64:6400,256,64,1 --backends cpu", "q");
}
TEST(CliInvalid, ViewExtentOverflows) {
  expect_invalid("check --q q:1,2,1,64:1,9223372036854775807,64,1 --backends cpu", "q");
}
// Lengths, offsets and extents near 2^63: an error naming the option and its value, never a
// signed overflow (UBSan aborted) or "cannot create std::vector larger than max_size()".
TEST(CliInvalid, SeqlenNear2To63) {
  expect_invalid("check --seqlen-q 9223372036854775807 --backends cpu", "--seqlen-q 9223372036854775807");
}
TEST(CliInvalid, HeadsTimesHeadDimOverflows) {
  expect_invalid("check --heads 4294967296 --head-dim 4294967296 --backends cpu", "--heads 4294967296");
}
TEST(CliInvalid, ViewOffsetNear2To63) {
  expect_invalid("check --q q+9223372036854775807:0,8,2,16:256,32,16,1 --backends cpu", "--q q+9223372036854775807");
}
TEST(CliInvalid, ViewShapeAndStridesNear2To63) {
  const std::string big = "9223372036854775807";
  expect_invalid("check --q q:1," + big + ",1,8:1," + big + ",8,1 --backends cpu", "--q 'q:1," + big + ",1,8");
  expect_invalid("check --q q:1,1099511627776,1,8:1,4611686018427387904,8,1 --backends cpu",
                 "--q q:1,1099511627776,1,8:1,4611686018427387904,8,1: reaches element");
}
TEST(CliInvalid, VarlenOffsetNear2To63) {
  expect_invalid("check --seqlens-q 10 --offsets-q 9223372036854775800 --backends cpu",
                 "--offsets-q 9223372036854775800");
}
// Eight-element K and V viewed with stride 0 over 2^50 keys: the buffers are tiny (the memory
// check said 1e9 GiB); what cannot be done is the fp64 reference's work, and it says so.
TEST(CliInvalid, StrideZeroOverHugeKeyCountIsRefusedForItsWork) {
  const std::string n = "1125899906842624";
  const std::string args = "check --dtype f32 --q q:1,4,1,8:32,8,8,1 --o o:1,4,1,8:32,8,8,1 --k k:1," + n +
                           ",1,8:0,0,0,1 --v v:1," + n + ",1,8:0,0,0,1 --backends cpu";
  expect_invalid(args, "FLOP");
  EXPECT_EQ(run_cli(args).err.find("GiB"), std::string::npos);
}

TEST(CliInvalid, NegativeSize) { expect_invalid("check --heads -3 --backends cpu", "negative"); }
TEST(CliInvalid, UnknownBackend) { expect_invalid("check --backends cpu,tpu", "tpu"); }
TEST(CliInvalid, InputScaleNotPositive) {
  expect_invalid("check --preset small --input-scale -1 --backends cpu", "--input-scale");
}
TEST(CliInvalid, PlantInputValue) {
  expect_invalid("check --preset small --plant-input q:3:zero --backends cpu", "--plant-input");
}
TEST(CliInvalid, PlantInputDoWithoutGrad) {
  expect_invalid("check --preset small --plant-input do:0:nan --backends cpu", "do");
}

// A planted NaN key and scaled-up inputs, through the whole check on odd (packed split)
// views: cpu must propagate the NaN where the fp64 definition does (exit 0), and the report
// says the case is the reproducer's.
TEST(Cli, CheckWithPlantedNanAndLargeInputsAgrees) {
  const Result r = run_cli(
      "check --dtype f32 --batch 2 --seqlen-q 70 --seqlen-kv 70 --heads 4 --kv-heads 2 --head-dim 16 "
      "--layout 'sb(h+2hg)d' --mask causal_bottom_right --grad --seed 5 --input-scale 30 "
      "--plant-input k:100:nan,v:7:inf --backends cpu,reference");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
}
TEST(CliInvalid, UnknownLayout) { expect_invalid("check --layout abcd", "abcd"); }
// An empty --layout silently fell back to the default layout, and --scale took hex
// ("0x10" ran with scale 16); both are now exit 2.
TEST(CliInvalid, EmptyLayout) { expect_invalid("check --layout= --backends cpu", "--layout"); }
TEST(CliInvalid, ScaleNotDecimal) { expect_invalid("check --scale 0x10 --backends cpu", "0x10"); }
// A case larger than the machine is refused before anything is allocated.
TEST(CliInvalid, CaseLargerThanHostMemory) {
  expect_invalid("check --seqlen-q 1048576 --heads 8 --head-dim 64 --backends cpu", "host memory");
}
TEST(CliInvalid, UnknownPreset) { expect_invalid("check --preset nope", "nope"); }
TEST(CliInvalid, UnknownDtype) { expect_invalid("check --dtype f8", "f8"); }
TEST(CliInvalid, UnknownMask) { expect_invalid("check --mask diagonal", "diagonal"); }
TEST(CliInvalid, NotAnInteger) { expect_invalid("check --seqlen-q 12x", "12x"); }
TEST(CliInvalid, PackedLayoutNeedsEqualHeads) {
  expect_invalid("check --layout sb3hd --heads 8 --kv-heads 2", "sb3hd");
}
// A size option beside a view that says otherwise printed h=4 and ran h=2; a repeated
// --mask took the last one; --seqlens-q -3 did not name the option.
TEST(CliInvalid, SizeOptionDisagreesWithView) {
  expect_invalid("check --heads 4 --q q:1,128,2,64:16384,128,64,1 --backends cpu",
                 "--heads 4 but --q q:1,128,2,64:16384,128,64,1 has heads 2");
  expect_invalid("check --head-dim-v 32 --o o:1,128,4,64:32768,256,64,1 --backends cpu", "--head-dim-v 32 but --o");
  expect_invalid("check --seqlen-kv 100 --k k:1,128,4,64:32768,256,64,1 --backends cpu", "--seqlen-kv 100 but --k");
  expect_invalid("check --seqlens-q 4,5 --seqlen-q 9 --backends cpu", "--seqlen-q 9");
}
TEST(CliInvalid, RepeatedOption) {
  expect_invalid("check --mask causal --mask none --backends cpu", "--mask given twice");
  expect_invalid("check --preset small --dtype f16 --dtype=bf16", "--dtype given twice");
  expect_invalid("check --seed 1 --backends cpu --seed 2", "--seed given twice");
}
TEST(CliInvalid, NegativeVarlenNamesTheOption) {
  expect_invalid("check --seqlens-q -3 --backends cpu", "--seqlens-q -3");
  expect_invalid("check --seqlens-q 3,4 --offsets-kv 0,-8 --backends cpu", "--offsets-kv 0,-8");
}
// One mask vocabulary: the library's parser, canonical names round-trip, aliases map, and
// the CLI uses it (it took only none, causal and causal-bottom-right).
// KV-cache checks (issue 20): each bad flag exits 2 with one line naming it.
TEST(CliKvCacheInvalid, UnknownOption) { expect_invalid("check --cache-seqlens 4 --bogus 1", "--bogus"); }
TEST(CliKvCacheInvalid, FuzzTakesNoJson) { expect_invalid("fuzz --kv-cache --cases 1 --json", "--json"); }
TEST(CliKvCacheInvalid, NeedsCacheSeqlens) { expect_invalid("check --page-size 4", "--cache-seqlens"); }
TEST(CliKvCacheInvalid, BadSeqlensList) { expect_invalid("check --cache-seqlens 4,x", "4,x"); }
TEST(CliKvCacheInvalid, PageSizeBelowOne) { expect_invalid("check --cache-seqlens 4 --page-size 0", "--page-size"); }
TEST(CliKvCacheInvalid, TableEntryOutOfRange) {
  expect_invalid("check --cache-seqlens 5 --page-size 4 --block-table '0,99' --backends cpu", "99");
}
TEST(CliKvCacheInvalid, TableRowCount) {
  expect_invalid("check --cache-seqlens 5 --page-size 4 --block-table '0,1;2'", "--block-table");
}
TEST(CliKvCacheInvalid, SizeDisagreesWithView) {
  expect_invalid("check --cache-seqlens 3 --page-size 4 --k-cache kv:2,8,2,64:2048,256,128,1", "--page-size 4");
}
TEST(CliKvCacheInvalid, LengthPastCapacity) {
  expect_invalid("check --cache-seqlens 9 --k-cache kc:1,8,2,64:1024,128,64,1 --backends cpu", "9");
}
TEST(CliKvCacheInvalid, FuzzTakesNoProblem) { expect_invalid("fuzz --kv-cache --cases 2 --heads 4", "--heads"); }

// A KV-cache explain names the cache and each backend's verdict, as `explain` does.
TEST(CliKvCache, ExplainNamesPagedCache) {
  const Result r = run_cli("explain --cache-seqlens 5,9 --page-size 4 --new-tokens 1");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("paged cache: 7 pages of 4 tokens"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("auto chooses: "), std::string::npos) << r.out;
}

// A paged check with an append: every backend agrees, the verdict line closes the report.
TEST(CliKvCache, PagedAppendAgrees) {
  const Result r =
      run_cli("check --cache-seqlens 6,0 --page-size 3 --new-tokens 2 --seqlen-q 2 --backends cpu,reference");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("cpu: agree"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("every compared backend agrees with the fp64 reference"), std::string::npos) << r.out;
}

std::set<std::string> keys(const nlohmann::json& j) {
  std::set<std::string> k;
  for (auto it = j.begin(); it != j.end(); ++it) k.insert(it.key());
  return k;
}

// --json of a KV-cache check: the attention check's shape (top-level keys, each backend's
// keys, the problem's keys) plus the cache, with real numbers that the rule judged.
TEST(CliKvCache, CheckJsonHasTheCheckShape) {
  const Result r =
      run_cli("check --cache-seqlens 6,0 --page-size 3 --new-tokens 2 --seqlen-q 2 --backends cpu,reference --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const Result plain = run_cli("check --preset small --backends cpu --json");
  ASSERT_EQ(plain.code, 0) << plain.err;
  const nlohmann::json p = nlohmann::json::parse(plain.out);
  EXPECT_EQ(keys(j), keys(p));
  for (const std::string& k : keys(p["problem"])) {
    if (k == "varlen") continue;
    EXPECT_TRUE(j["problem"].contains(k)) << k;
  }
  ASSERT_EQ(j["backends"].size(), 2u);
  for (const std::string& k : keys(p["backends"][0])) EXPECT_TRUE(j["backends"][0].contains(k)) << k;
  EXPECT_EQ(j["exit_code"], 0);
  EXPECT_NE(j["layout"].get<std::string>().find("paged cache"), std::string::npos) << j["layout"];
  EXPECT_EQ(j["problem"]["kv_cache"]["page_size"], 3);
  EXPECT_EQ(j["problem"]["kv_cache"]["cache_seqlens"], nlohmann::json::array({6, 0}));
  EXPECT_EQ(j["problem"]["kv_cache"]["new_tokens"], 2);
  EXPECT_EQ(j["problem"]["seqlen_kv"], j["problem"]["kv_cache"]["capacity"]);
  for (const auto& b : j["backends"]) {
    EXPECT_EQ(b["status"], "ok") << b;
    EXPECT_GT(b["max_abs_err"].get<double>(), 0.0) << b;  // a real comparison: f16 rounds
    EXPECT_LE(b["max_abs_err"].get<double>(), b["tolerance"].get<double>()) << b;
    EXPECT_TRUE(b["lse"]["pass"].get<bool>()) << b;
    EXPECT_TRUE(b["written_ok"].get<bool>()) << b;
    EXPECT_TRUE(b["caches_ok"].get<bool>()) << b;
  }
  EXPECT_NE(j["reproducer"].get<std::string>().find("--seed 1"), std::string::npos) << j["reproducer"];
  EXPECT_EQ(j["reproducer"].get<std::string>().find("--json"), std::string::npos) << j["reproducer"];
}

// --json of a KV-cache explain: explain's keys, the cache in the layout, auto's choice.
TEST(CliKvCache, ExplainJsonHasTheExplainShape) {
  const Result r = run_cli("explain --cache-seqlens 5,9 --page-size 4 --new-tokens 1 --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const Result plain = run_cli("explain --preset small --json");
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(keys(j), keys(nlohmann::json::parse(plain.out)));
  EXPECT_NE(j["layout"].get<std::string>().find("paged cache: 7 pages of 4 tokens"), std::string::npos);
  EXPECT_TRUE(j["forward"]["chosen"].is_string()) << j["forward"];
  EXPECT_FALSE(j["forward"]["verdicts"].empty());
  EXPECT_EQ(j["problem"]["kv_cache"]["num_pages"], 7);
}

// Under --json an invalid KV-cache case is the error object on stdout (and one line on stderr).
TEST(CliKvCache, JsonErrorObject) {
  const std::string args = "check --cache-seqlens 9 --k-cache kc:1,8,2,64:1024,128,64,1 --backends cpu --json";
  expect_invalid(args, "9");
  const Result r = run_cli(args);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["error"]["code"], "invalid_argument");
  EXPECT_EQ(j["exit_code"], 2);
  EXPECT_NE(j["error"]["message"].get<std::string>().find("9"), std::string::npos);
}

TEST(MaskNames, CanonicalNamesAndAliases) {
  for (MaskKind m : {MaskKind::none, MaskKind::causal, MaskKind::causal_bottom_right})
    EXPECT_EQ(mask_from_string(to_string(m)), m) << to_string(m);
  EXPECT_EQ(to_string(MaskKind::causal_bottom_right), "causal_bottom_right");
  EXPECT_EQ(mask_from_string("no_mask"), MaskKind::none);
  EXPECT_EQ(mask_from_string("top_left"), MaskKind::causal);
  EXPECT_EQ(mask_from_string("causal_top_left"), MaskKind::causal);
  EXPECT_EQ(mask_from_string("bottom_right"), MaskKind::causal_bottom_right);
  for (const char* bad : {"", "Causal", "diagonal", "padding", "causal_bottom", "top-left"})
    EXPECT_FALSE(mask_from_string(bad).has_value()) << bad;
  for (auto [name, want] : {std::pair{"bottom_right", "causal_bottom_right"}, std::pair{"causal_top_left", "causal"},
                            std::pair{"no_mask", "none"}}) {
    const Result r = run_cli(std::string("explain --mask ") + name + " --json");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["problem"]["mask"], want) << name;
  }
  expect_invalid("check --mask diagonal", "causal_bottom_right");
  expect_invalid("check --mask diagonal", "causal_top_left");
}
TEST(CliInvalid, FuzzNeedsCases) { expect_invalid("fuzz --grad", "--cases"); }
TEST(CliInvalid, FuzzTakesNoProblem) { expect_invalid("fuzz --cases 3 --heads 4", "--heads"); }
TEST(CliInvalid, ExplainValidates) { expect_invalid("explain --heads 5 --kv-heads 2", "5"); }

// An unknown STRIDEATTN_BACKEND: explain said "auto chooses: nothing (see above)" with nothing
// above, check and the demo exited 1 (DISAGREES). Now a usage error (exit 2) everywhere.
TEST(CliInvalid, UnknownBackendEnvironmentIsAUsageError) {
  const std::string env = "STRIDEATTN_BACKEND=garbage";
  for (const char* args : {"", "explain --preset small", "explain --preset small --grad --json",
                           "check --preset small --backends cpu", "check --preset small --backends auto",
                           "bench --preset small --backends cpu", "fuzz --cases 1 --backends cpu"}) {
    expect_invalid(args, "STRIDEATTN_BACKEND='garbage'", env);
    expect_invalid(args, "supported: auto, reference, cpu, cuda, cudnn", env);
  }
  EXPECT_EQ(run_cli("explain --preset small", "STRIDEATTN_BACKEND=cpu").code, 0);
}

// The library's explain() reports it as a validation failure, not a silent "chosen: none".
TEST(CliLibrary, ExplainRefusesUnknownBackendEnvironment) {
  Invocation inv;
  ASSERT_TRUE(parse_command_line({"explain", "--preset", "small"}, &inv).ok());
  ::setenv("STRIDEATTN_BACKEND", "garbage", 1);
  Explanation fwd;
  const Status s = harness::explain_case(inv.spec, &fwd, nullptr);
  ::unsetenv("STRIDEATTN_BACKEND");
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(fwd.validation.code(), StatusCode::invalid_argument);
  EXPECT_NE(fwd.validation.message().find("'garbage'"), std::string::npos) << fwd.validation.message();
  EXPECT_NE(fwd.validation.message().find("cudnn"), std::string::npos) << fwd.validation.message();
}

// Under --json every error is one JSON object on stdout (it printed nothing there).
TEST(CliJson, ErrorsAreJsonOnStdout) {
  struct Case {
    std::string args, env, mention;
    int code;
  };
  const Case cases[] = {
      {"check --heads x --json", "", "--heads", 2},
      {"check --json --bogus 3", "", "--bogus", 2},
      {"check --preset small --backends cpu --json --layout sb3hd --heads 8 --kv-heads 2", "", "sb3hd", 2},
      {"explain --preset small --json", "STRIDEATTN_BACKEND=garbage", "garbage", 2},
      {"fuzz --json", "", "--cases", 2},
      {"bench --preset small --json --seqlen-q 9223372036854775807", "", "9223372036854775807", 2},
  };
  for (const Case& c : cases) {
    const Result r = run_cli(c.args, c.env);
    EXPECT_EQ(r.code, c.code) << c.args << "\n" << r.out << r.err;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << c.args << ": stdout is not JSON: " << r.out;
    EXPECT_EQ(j["error"]["code"], "invalid_argument") << r.out;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(c.mention), std::string::npos) << r.out;
    EXPECT_EQ(j["exit_code"], c.code) << r.out;
    EXPECT_EQ(lines(r.err), 1) << r.err;
  }
}

// The demo's `auto` row names the backend auto ran (text "auto:cpu", JSON "chosen").
TEST(Cli, AutoRowNamesTheChosenBackend) {
  const Result r = run_cli("check --preset small --backends auto --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const std::string want = strideattn::harness::gpu_available() ? "cudnn" : "cpu";
  EXPECT_EQ(j["backends"][0]["chosen"], want) << r.out;
  const Result t = run_cli("check --preset small --backends auto,cpu");
  EXPECT_NE(t.out.find("auto:" + want + " "), std::string::npos) << t.out;
  EXPECT_EQ(t.out.find("DESIGN"), std::string::npos) << t.out;
}

// A progress line on stderr only when stderr is a terminal, never under --json.
TEST(Cli, ProgressLineOnlyOnATerminal) {
  const Result plain = run_cli("fuzz --cases 2 --seed 3 --backends cpu");
  EXPECT_EQ(plain.err, "") << "stderr is not a terminal here";
  if (std::system("command -v script >/dev/null 2>&1") != 0) GTEST_SKIP() << "no `script` to make a terminal";
  // `script` runs the CLI on a pseudo-terminal; stdout and stderr both land in its output.
  const std::string cli = std::string("'") + STRIDEATTN_CLI + "'";
  const Result tty = run_shell("script -qec \"" + cli + " fuzz --cases 2 --seed 3 --backends cpu\" /dev/null");
  EXPECT_NE(tty.out.find("strideattn: fuzz: case 2/2, 0 failed"), std::string::npos) << tty.out;
  EXPECT_NE(tty.out.find("fuzz: 2 cases"), std::string::npos) << tty.out;
  const Result json = run_shell("script -qec \"" + cli + " fuzz --cases 2 --seed 3 --backends cpu --json\" /dev/null");
  EXPECT_EQ(json.out.find("fuzz: case"), std::string::npos) << json.out;
}

TEST(Cli, HelpExitsZero) {
  const Result r = run_cli("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("strideattn check"), std::string::npos);
  EXPECT_NE(r.out.find("reference"), std::string::npos);
}

TEST(Cli, CheckSmallOnCpuAgrees) {
  const Result r = run_cli("check --preset small --backends reference,cpu --grad");
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("bshd_bshd_bshd"), std::string::npos) << r.out;
}

TEST(Cli, DisagreementExitsOneAndNamesTheWorstElement) {
  // The hidden test hook corrupts element 5 of dv after each backend's backward.
  const Result r = run_cli("check --preset small --backends reference,cpu --grad --test-plant value:dv:5:0.5");
  EXPECT_EQ(r.code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("DISAGREES: cpu mismatch: dv[b=0,s=0,h=0,d=5]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("reproduce: strideattn check"), std::string::npos) << r.out;
  const Result g = run_cli("check --preset small --backends cpu --test-plant guard:o:0:0 --json");
  EXPECT_EQ(g.code, 1) << g.out << g.err;
  const nlohmann::json j = nlohmann::json::parse(g.out);
  EXPECT_EQ(j["backends"][0]["status"], "mismatch");
  EXPECT_EQ(j["backends"][0]["guard_ok"], false);
}

TEST(Cli, CheckJsonHasTheContractFields) {
  const Result r = run_cli("check --preset varlen --backends reference,cpu,cuda --grad --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("problem"));
  ASSERT_TRUE(j.contains("layout"));
  EXPECT_TRUE(j["layout"].is_string());
  EXPECT_EQ(j["problem"]["varlen"]["seqlens_q"].size(), 4u);
  ASSERT_EQ(j["backends"].size(), 3u);
  for (const auto& b : j["backends"]) {
    for (const char* k :
         {"backend", "status", "reason", "max_abs_err", "max_rel_err", "tolerance", "time_ms", "tflops"})
      EXPECT_TRUE(b.contains(k)) << k << " missing in " << b.dump();
    if (b["status"] == "ok") {
      EXPECT_TRUE(b["max_abs_err"].is_number());
      EXPECT_LE(b["max_abs_err"].get<double>(), b["tolerance"].get<double>());
      for (const char* g : {"dq", "dk", "dv"}) {
        ASSERT_TRUE(b["grad"].contains(g)) << b.dump();
        EXPECT_TRUE(b["grad"][g]["max_abs_err"].is_number());
        EXPECT_TRUE(b["grad"][g]["tolerance"].is_number());
      }
    } else {
      EXPECT_EQ(b["status"], "unsupported") << b.dump();
      EXPECT_FALSE(b["reason"].get<std::string>().empty());
    }
  }
}

TEST(Cli, ExplainJson) {
  const Result r = run_cli("explain --preset seed --grad --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["layout"].get<std::string>().find("(h+2hg)"), std::string::npos) << j["layout"];
  EXPECT_FALSE(j["forward"]["verdicts"].empty());
  EXPECT_FALSE(j["backward"]["verdicts"].empty());
}

TEST(Cli, ExplicitViewsAliasOneBuffer) {
  // The seed's split views written out by hand: q, k, v in one buffer, heads 16/1, d 64.
  const Result r = run_cli(
      "check --dtype f16 --mask causal --backends cpu "
      "--q qkv:1,300,16,64:1152,1152,64,1 --k qkv+1024:1,300,1,64:1152,1152,64,1 "
      "--v qkv+1088:1,300,1,64:1152,1152,64,1 --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["problem"]["heads"], 16);
  EXPECT_EQ(j["problem"]["kv_heads"], 1);
  EXPECT_EQ(j["problem"]["seqlen_q"], 300);
  EXPECT_EQ(j["backends"][0]["status"], "ok") << j.dump();
}

TEST(Cli, FuzzJson) {
  const Result r = run_cli("fuzz --cases 5 --seed 4 --backends cpu --json");
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["cases"], 5);
  EXPECT_TRUE(j["failures"].is_array());
  EXPECT_TRUE(j.contains("backends"));
  EXPECT_EQ(r.code, j["failures"].empty() ? 0 : 1);
}

TEST(Cli, FuzzMinRanDrawsUntilEveryBackendRanEnough) {
  // --cases 0: every case drawn is there to reach --min-ran.
  const Result r = run_cli("fuzz --cases 0 --min-ran 7 --seed 5 --backends cpu --json");
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& cpu = j["backends"]["cpu"];
  const std::int64_t ran = cpu.value("ok", std::int64_t{0}) + cpu.value("mismatch", std::int64_t{0});
  EXPECT_EQ(ran, 7) << r.out;  // stops at the first draw that reaches it
  EXPECT_GE(j["cases"].get<std::int64_t>(), 7);
  EXPECT_EQ(r.code, j["failures"].empty() ? 0 : 1) << r.out;
}

TEST(Cli, FuzzMinRanShortFailsAndSaysWhy) {
  if (strideattn::harness::gpu_available()) GTEST_SKIP() << "needs a machine where cuda refuses every case";
  const Result r = run_cli("fuzz --cases 0 --min-ran 1 --seed 5 --backends cuda");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("backend cuda ran 0 cases in 50 draws; --min-ran asks 1"), std::string::npos) << r.out;
}

TEST(CliInvalid, FuzzMinRanNegative) { expect_invalid("fuzz --cases 1 --min-ran -1", "--min-ran"); }

TEST(Cli, BenchJson) {
  const Result r = run_cli("bench --preset small --backends cpu --json");
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["backends"].size(), 1u);
  EXPECT_EQ(j["backends"][0]["status"], "ok");
  EXPECT_GE(j["backends"][0]["runs"].get<int>(), 20);
  EXPECT_GT(j["backends"][0]["tflops"].get<double>(), 0);
}

// Split a reproducer line the way a shell would (it quotes only with single quotes).
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false, any = false;
  for (char c : line) {
    if (c == '\'') {
      quoted = !quoted;
      any = true;
    } else if (c == ' ' && !quoted) {
      if (any) out.push_back(cur);
      cur.clear();
      any = false;
    } else {
      cur += c;
      any = true;
    }
  }
  if (any) out.push_back(cur);
  return out;
}

bool same(const harness::ViewSpec& a, const harness::ViewSpec& b) {
  return a.buffer == b.buffer && a.offset == b.offset && a.shape == b.shape && a.stride == b.stride;
}

TEST(Reproducer, ParsesBackIntoTheSameCase) {
  for (int i = 0; i < 300; ++i) {
    const harness::CaseSpec spec = random_case(99, i, i % 2 == 0);
    const std::string line = harness::reproducer(spec, {Backend::cpu});
    std::vector<std::string> words = shell_words(line);
    ASSERT_GE(words.size(), 2u);
    ASSERT_EQ(words[0], "strideattn");
    words.erase(words.begin());
    Invocation inv;
    const Status s = parse_command_line(words, &inv);
    ASSERT_TRUE(s.ok()) << line << "\n" << s.message();
    const harness::CaseSpec& got = inv.spec;
    EXPECT_EQ(got.dtype, spec.dtype) << line;
    EXPECT_EQ(got.seed, spec.seed) << line;
    EXPECT_EQ(got.grad, spec.grad) << line;
    EXPECT_EQ(got.sizes.heads, spec.sizes.heads) << line;
    EXPECT_EQ(got.sizes.kv_heads, spec.sizes.kv_heads) << line;
    EXPECT_EQ(got.sizes.d_qk, spec.sizes.d_qk) << line;
    EXPECT_EQ(got.sizes.d_v, spec.sizes.d_v) << line;
    EXPECT_EQ(got.sizes.seqlens_q, spec.sizes.seqlens_q) << line;
    EXPECT_EQ(got.sizes.offsets_kv, spec.sizes.offsets_kv) << line;
    EXPECT_EQ(got.options.mask, spec.options.mask) << line;
    EXPECT_EQ(got.options.window.left, spec.options.window.left) << line;
    EXPECT_EQ(got.options.window.right, spec.options.window.right) << line;
    EXPECT_EQ(got.options.scale, spec.options.scale) << line;
    EXPECT_EQ(got.options.deterministic, spec.options.deterministic) << line;
    EXPECT_EQ(got.input_scale, spec.input_scale) << line;
    ASSERT_EQ(got.input_plants.size(), spec.input_plants.size()) << line;
    for (std::size_t j = 0; j < spec.input_plants.size(); ++j) {
      EXPECT_EQ(got.input_plants[j].tensor, spec.input_plants[j].tensor) << line;
      EXPECT_EQ(got.input_plants[j].index, spec.input_plants[j].index) << line;
      EXPECT_EQ(std::isnan(got.input_plants[j].value), std::isnan(spec.input_plants[j].value)) << line;
      if (!std::isnan(spec.input_plants[j].value))
        EXPECT_EQ(got.input_plants[j].value, spec.input_plants[j].value) << line;
    }
    EXPECT_TRUE(same(got.views.q, spec.views.q)) << line;
    EXPECT_TRUE(same(got.views.k, spec.views.k)) << line;
    EXPECT_TRUE(same(got.views.v, spec.views.v)) << line;
    EXPECT_TRUE(same(got.views.o, spec.views.o)) << line;
    if (spec.grad) {
      EXPECT_TRUE(same(got.views.d_o, spec.views.d_o)) << line;
      EXPECT_TRUE(same(got.views.dq, spec.views.dq)) << line;
      EXPECT_TRUE(same(got.views.dk, spec.views.dk)) << line;
      EXPECT_TRUE(same(got.views.dv, spec.views.dv)) << line;
    }
  }
}

TEST(Fuzz, CoversTheCaseSpace) {
  int varlen = 0, mqa = 0, dv_differs = 0, window = 0, s1 = 0, sq_gt_skv = 0, sq_lt_skv = 0, explicit_views = 0,
      f32 = 0;
  std::set<std::string> layouts;
  for (int i = 0; i < 1000; ++i) {
    const harness::CaseSpec s = random_case(1, i, true);
    varlen += s.sizes.varlen();
    mqa += s.sizes.kv_heads == 1 && s.sizes.heads > 1;
    dv_differs += s.sizes.d_v != s.sizes.d_qk;
    window += !s.options.window.unbounded();
    s1 += !s.sizes.varlen() && (s.sizes.s_q == 1 || s.sizes.s_kv == 1);
    sq_gt_skv += !s.sizes.varlen() && s.sizes.s_q > s.sizes.s_kv;
    sq_lt_skv += !s.sizes.varlen() && s.sizes.s_q < s.sizes.s_kv;
    explicit_views += s.layout_name.empty();
    f32 += s.dtype == DType::f32;
    if (!s.layout_name.empty()) layouts.insert(s.layout_name);
    EXPECT_EQ(s.sizes.d_qk % 8, 0);
    EXPECT_LE(s.sizes.d_qk, 256);
  }
  for (int n : {varlen, mqa, dv_differs, window, s1, sq_gt_skv, sq_lt_skv, explicit_views, f32}) EXPECT_GT(n, 20);
  EXPECT_EQ(layouts.size(), harness::layout_names().size());
}

// fuzz --logit-limit (cap_logits): over 2,000 drawn cases with gradients, every capped case's
// typical scaled logit (input_scale^2 * scale * sqrt(d_qk)) and input_scale^2 stay within the
// limit, planted non-finite inputs and the rest of the case are kept, and the draws do exceed
// the limit before the cap (else this could not fail).
TEST(CliFuzz, LogitLimitCapsTheDraws) {
  constexpr double kLimit = 1000;
  int capped = 0, planted = 0;
  for (std::int64_t i = 0; i < 2000; ++i) {
    const harness::CaseSpec drawn = random_case(4242, i, true);
    harness::CaseSpec c = drawn;
    cap_logits(kLimit, &c);
    const double root_d = std::sqrt(double(std::max<std::int64_t>(c.sizes.d_qk, 1)));
    const double eff = c.options.scale.value_or(1 / root_d) * root_d;
    const double before = drawn.input_scale * drawn.input_scale * drawn.options.scale.value_or(1 / root_d) * root_d;
    capped += before > kLimit || drawn.input_scale * drawn.input_scale > kLimit;
    planted += !c.input_plants.empty();
    EXPECT_LE(c.input_scale * c.input_scale * eff, kLimit * (1 + 1e-12)) << "case " << i;
    EXPECT_LE(c.input_scale * c.input_scale, kLimit * (1 + 1e-12)) << "case " << i;
    EXPECT_GE(c.input_scale, 1.0) << "case " << i;
    EXPECT_EQ(c.input_plants.size(), drawn.input_plants.size()) << "case " << i;
    EXPECT_EQ(c.sizes.s_q, drawn.sizes.s_q);
    EXPECT_EQ(c.seed, drawn.seed);
    if (drawn.input_scale * drawn.input_scale * eff <= kLimit && drawn.input_scale * drawn.input_scale <= kLimit &&
        drawn.options.scale == c.options.scale)
      EXPECT_EQ(c.input_scale, drawn.input_scale) << "case " << i << ": capped though within the limit";
  }
  EXPECT_GT(capped, 100) << "too few draws beyond the limit for the cap to be tested";
  EXPECT_GT(planted, 10) << "too few planted cases to see them kept";
  harness::CaseSpec unlimited = random_case(4242, 7, true);
  const double scale_before = unlimited.input_scale;
  cap_logits(0, &unlimited);  // 0: no limit
  EXPECT_EQ(unlimited.input_scale, scale_before);
}

}  // namespace
}  // namespace strideattn::cli

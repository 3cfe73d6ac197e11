// Parsing the CLI grammar (docs/design.md "CLI") into an Invocation; presets; the usage text.
#include "cli_args.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "harness/checked.hpp"

namespace strideattn::cli {

namespace {

using harness::LayoutViews;
using harness::ProblemSizes;
using harness::ViewSpec;

// The mask vocabulary of mask_from_string (strideattn.hpp), for the usage text and errors.
constexpr const char* kMaskNames =
    "none, causal (top-left), causal_bottom_right (aliases: no_mask = none, top_left and "
    "causal_top_left = causal, bottom_right = causal_bottom_right)";

Status bad(std::string msg) { return Status(StatusCode::invalid_argument, std::move(msg)); }

Status parse_int(const std::string& opt, const std::string& text, std::int64_t* out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, *out);
  if (ec != std::errc() || p != end || text.empty()) return bad("--" + opt + " '" + text + "': expected an integer");
  return Status::Ok();
}

Status parse_list(const std::string& opt, const std::string& text, std::vector<std::int64_t>* out) {
  out->clear();
  std::string item;
  std::istringstream is(text);
  while (std::getline(is, item, ',')) {
    std::int64_t x = 0;
    if (item.empty() || !parse_int(opt, item, &x).ok())
      return bad("--" + opt + " '" + text + "': expected integers separated by commas");
    out->push_back(x);
  }
  if (out->empty() || text.back() == ',')
    return bad("--" + opt + " '" + text + "': expected integers separated by commas");
  return Status::Ok();
}

// Which options each command takes, and whether they take a value.
const std::set<std::string> kProblemValued = {
    "preset",     "dtype",      "batch",      "seqlen-q", "seqlen-kv",   "heads",       "kv-heads",
    "head-dim",   "head-dim-v", "layout",     "q",        "k",           "v",           "o",
    "do",         "dq",         "dk",         "dv",       "seqlens-q",   "seqlens-kv",  "offsets-q",
    "offsets-kv", "mask",       "window",     "scale",    "input-scale", "plant-input", "softcap",
    "dropout",    "rng-seed",   "rng-offset", "bias",     "bias-type",   "bias-dtype",  "dbias"};
const std::set<std::string> kProblemFlags = {"deterministic", "alibi", "alibi-per-batch", "sinks", "max-logit"};

struct CommandOptions {
  std::set<std::string> valued, flags;
  bool problem = false;
};

CommandOptions options_of(Command c) {
  switch (c) {
    // test-plant: hidden test hook (harness::CaseSpec::plant), KIND:TENSOR:INDEX:DELTA
    case Command::check:
      return {{"backends", "seed", "test-plant"}, {"grad", "json", "cu-seqlens", "via-plan"}, true};
    case Command::explain:
      return {{}, {"grad", "json"}, true};
    case Command::bench:
      return {{"backends", "seed", "runs"}, {"grad", "json", "cu-seqlens"}, true};
    case Command::fuzz:
      return {{"cases", "seed", "backends", "min-ran", "logit-limit"},
              {"grad", "json", "require-gpu", "require-ran", "finite-inputs", "cu-seqlens", "via-plan", "features"},
              false};
    default:
      return {};
  }
}

Status parse_backends(const std::string& text, std::vector<Backend>* out) {
  out->clear();
  std::string item;
  std::istringstream is(text);
  while (std::getline(is, item, ',')) {
    std::optional<Backend> b = backend_from_string(item);
    if (!b)
      return bad("unknown backend '" + item + "' in --backends; supported: reference, cpu, " + "cuda, cudnn, auto");
    if (std::find(out->begin(), out->end(), *b) == out->end()) out->push_back(*b);
  }
  if (out->empty()) return bad("--backends '" + text + "': expected a list such as cpu,cuda");
  return Status::Ok();
}

// The PROBLEM options as given, before resolution.
struct RawProblem {
  std::map<std::string, std::string> values;  // option -> text (each given at most once)
  std::set<std::string> flags;
  [[nodiscard]] bool has(const std::string& k) const { return values.count(k) > 0; }
};

Status resolve_problem(const RawProblem& raw, bool grad, harness::CaseSpec* spec) {
  const Preset* preset = nullptr;
  if (raw.has("preset")) {
    const std::string& name = raw.values.at("preset");
    for (const Preset& p : presets())
      if (p.name == name) preset = &p;
    if (!preset) {
      std::string known;
      for (const Preset& p : presets()) known += (known.empty() ? "" : ", ") + p.name;
      return bad("unknown preset '" + name + "'; supported: " + known);
    }
  }
  ProblemSizes z;
  z.batch = 1, z.s_q = 128, z.s_kv = 128, z.heads = 4, z.kv_heads = 4, z.d_qk = 64, z.d_v = 64;
  spec->dtype = DType::f16;
  spec->options = AttentionOptions{};
  std::string layout;
  if (preset) {
    z = preset->sizes;
    spec->dtype = preset->dtype;
    spec->options = preset->options;
    layout = preset->layout;
  }

  // Explicit views.
  std::map<std::string, ViewSpec> views;
  for (const char* t : {"q", "k", "v", "o", "do", "dq", "dk", "dv"})
    if (raw.has(t)) {
      ViewSpec v;
      if (Status s = parse_view(t, raw.values.at(t), &v); !s.ok()) return s;
      views[t] = v;
    }
  auto from_view = [&](std::int64_t* field, int dim, std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (views.count(n)) {
        *field = views.at(n).shape[dim];
        return true;
      }
    return false;
  };
  // Sizes: command line > explicit views > preset > defaults.
  const bool kv_from_view = from_view(&z.s_kv, kSeq, {"k", "v", "dk", "dv"});
  from_view(&z.batch, kBatch, {"q", "o", "k", "v", "do", "dq", "dk", "dv"});
  from_view(&z.s_q, kSeq, {"q", "o", "do", "dq"});
  from_view(&z.heads, kHead, {"q", "o", "do", "dq"});
  const bool hg_from_view = from_view(&z.kv_heads, kHead, {"k", "v", "dk", "dv"});
  from_view(&z.d_qk, kHeadDim, {"q", "k", "dq", "dk"});
  const bool dv_from_view = from_view(&z.d_v, kHeadDim, {"v", "o", "do", "dv"});

  struct SizeOpt {
    const char* name;
    std::int64_t* field;
  };
  for (SizeOpt o : {SizeOpt{"batch", &z.batch}, SizeOpt{"seqlen-q", &z.s_q}, SizeOpt{"seqlen-kv", &z.s_kv},
                    SizeOpt{"heads", &z.heads}, SizeOpt{"kv-heads", &z.kv_heads}, SizeOpt{"head-dim", &z.d_qk},
                    SizeOpt{"head-dim-v", &z.d_v}})
    if (raw.has(o.name)) {
      if (Status s = parse_int(o.name, raw.values.at(o.name), o.field); !s.ok()) return s;
      if (*o.field < 0) return bad("--" + std::string(o.name) + " " + raw.values.at(o.name) + ": must not be negative");
    }
  // A size option and an explicit view that disagree: refuse, naming both (the views won
  // silently for some dimensions and the option for others).
  const bool varlen_given =
      raw.has("seqlens-q") || raw.has("seqlens-kv") || raw.has("offsets-q") || raw.has("offsets-kv");
  struct ViewDim {
    const char* option;
    int dim;
    const char* what;
    std::initializer_list<const char*> tensors;
  };
  for (const ViewDim& c : {ViewDim{"batch", kBatch, "batch", {"q", "o", "k", "v", "do", "dq", "dk", "dv"}},
                           ViewDim{"seqlen-q", kSeq, "seqlen", {"q", "o", "do", "dq"}},
                           ViewDim{"seqlen-kv", kSeq, "seqlen", {"k", "v", "dk", "dv"}},
                           ViewDim{"heads", kHead, "heads", {"q", "o", "do", "dq"}},
                           ViewDim{"kv-heads", kHead, "heads", {"k", "v", "dk", "dv"}},
                           ViewDim{"head-dim", kHeadDim, "head dim", {"q", "k", "dq", "dk"}},
                           ViewDim{"head-dim-v", kHeadDim, "head dim", {"v", "o", "do", "dv"}}}) {
    if (!raw.has(c.option)) continue;
    if (varlen_given && c.dim != kHead && c.dim != kHeadDim) {
      if (std::string(c.option) == "batch") continue;  // checked against --seqlens-q below
      return bad("--" + std::string(c.option) + " " + raw.values.at(c.option) +
                 " with varlen options: the sequence lengths come from --seqlens-q/--seqlens-kv;"
                 " drop --" +
                 c.option);
    }
    std::int64_t given = 0;
    (void)parse_int(c.option, raw.values.at(c.option), &given);
    for (const char* t : c.tensors)
      if (views.count(t) && views.at(t).shape[c.dim] != given)
        return bad("--" + std::string(c.option) + " " + raw.values.at(c.option) + " but --" + t + " " +
                   format_view(views.at(t)) + " has " + c.what + " " + std::to_string(views.at(t).shape[c.dim]) +
                   "; give one or make them agree");
  }
  // A size given alone carries its partner along (unless a view or option says otherwise).
  if (raw.has("seqlen-q") && !raw.has("seqlen-kv") && !kv_from_view) z.s_kv = z.s_q;
  if (raw.has("heads") && !raw.has("kv-heads") && !hg_from_view && !preset) z.kv_heads = z.heads;
  if (raw.has("head-dim") && !raw.has("head-dim-v") && !dv_from_view) z.d_v = z.d_qk;

  // Varlen.
  const bool any_varlen =
      raw.has("seqlens-q") || raw.has("seqlens-kv") || raw.has("offsets-q") || raw.has("offsets-kv");
  if (any_varlen) {
    if (!raw.has("seqlens-q")) return bad("varlen options need --seqlens-q (token counts of each query sequence)");
    z.seqlens_q.clear(), z.seqlens_kv.clear(), z.offsets_q.clear(), z.offsets_kv.clear();
    if (Status s = parse_list("seqlens-q", raw.values.at("seqlens-q"), &z.seqlens_q); !s.ok()) return s;
    z.seqlens_kv = z.seqlens_q;
    if (raw.has("seqlens-kv"))
      if (Status s = parse_list("seqlens-kv", raw.values.at("seqlens-kv"), &z.seqlens_kv); !s.ok()) return s;
    if (raw.has("offsets-q"))
      if (Status s = parse_list("offsets-q", raw.values.at("offsets-q"), &z.offsets_q); !s.ok()) return s;
    if (raw.has("offsets-kv"))
      if (Status s = parse_list("offsets-kv", raw.values.at("offsets-kv"), &z.offsets_kv); !s.ok()) return s;
    for (auto [name, list] : {std::pair{"seqlens-q", &z.seqlens_q}, std::pair{"seqlens-kv", &z.seqlens_kv},
                              std::pair{"offsets-q", &z.offsets_q}, std::pair{"offsets-kv", &z.offsets_kv}})
      for (std::int64_t x : *list)
        if (x < 0)
          return bad("--" + std::string(name) + " " + raw.values.at(name) + ": " +
                     (name[0] == 's' ? "token counts" : "offsets") + " must not be negative (found " +
                     std::to_string(x) + ")");
    const std::int64_t n = std::int64_t(z.seqlens_q.size());
    if (std::int64_t(z.seqlens_kv.size()) != n)
      return bad("--seqlens-kv has " + std::to_string(z.seqlens_kv.size()) + " sequences but --seqlens-q has " +
                 std::to_string(n) + "; they must match");
    if (!z.offsets_q.empty() && std::int64_t(z.offsets_q.size()) != n)
      return bad("--offsets-q has " + std::to_string(z.offsets_q.size()) + " entries but there are " +
                 std::to_string(n) + " sequences");
    if (!z.offsets_kv.empty() && std::int64_t(z.offsets_kv.size()) != n)
      return bad("--offsets-kv has " + std::to_string(z.offsets_kv.size()) + " entries but there are " +
                 std::to_string(n) + " sequences");
    if (raw.has("batch") && z.batch != n)
      return bad("--batch " + std::to_string(z.batch) + " but --seqlens-q lists " + std::to_string(n) +
                 " sequences; give one or make them agree");
    z.batch = n;
    z.s_q = z.seqlens_q.empty() ? 0 : *std::max_element(z.seqlens_q.begin(), z.seqlens_q.end());
    z.s_kv = z.seqlens_kv.empty() ? 0 : *std::max_element(z.seqlens_kv.begin(), z.seqlens_kv.end());
    if (!raw.has("layout") && layout.rfind("t", 0) != 0) layout = "thd_thd_thd";
  } else if (preset && preset->sizes.varlen() && (raw.has("batch") || raw.has("seqlen-q"))) {
    return bad("preset '" + preset->name + "' is varlen; give --seqlens-q instead of " +
               (raw.has("batch") ? "--batch" : "--seqlen-q"));
  }
  if (raw.has("layout")) {
    layout = raw.values.at("layout");
    if (layout.empty()) return bad("--layout '': expected a layout name such as bshd_bshd_bshd");
  }
  if (layout.empty()) layout = z.varlen() ? "thd_thd_thd" : "bshd_bshd_bshd";

  // dtype and options.
  if (raw.has("dtype")) {
    const std::string& d = raw.values.at("dtype");
    if (d == "f16" || d == "fp16")
      spec->dtype = DType::f16;
    else if (d == "bf16")
      spec->dtype = DType::bf16;
    else if (d == "f32" || d == "fp32")
      spec->dtype = DType::f32;
    else
      return bad("unknown --dtype '" + d + "'; supported: f16, bf16, f32");
  }
  if (raw.has("mask")) {
    const std::string& m = raw.values.at("mask");
    const std::optional<MaskKind> mask = mask_from_string(m);
    if (!mask) return bad("unknown --mask '" + m + "'; supported: " + std::string(kMaskNames));
    spec->options.mask = *mask;
  }
  if (raw.has("window")) {
    std::vector<std::int64_t> w;
    const std::string& t = raw.values.at("window");
    if (!parse_list("window", t, &w).ok() || w.size() != 2)
      return bad("--window '" + t + "': expected LEFT,RIGHT (two integers, -1 = unbounded)");
    spec->options.window = Window{.left = w[0], .right = w[1]};
  }
  if (raw.has("scale")) {
    const std::string& t = raw.values.at("scale");
    char* end = nullptr;
    const double x = std::strtod(t.c_str(), &end);
    // strtod also takes hex ("0x10"), leading blanks and "infinity"; only decimal is meant.
    const bool decimal = !t.empty() && t.find_first_not_of("0123456789.eE+-") == std::string::npos;
    if (!decimal || end != t.c_str() + t.size() || !std::isfinite(x))
      return bad("--scale '" + t + "': expected a finite number");
    spec->options.scale = x;
  }
  if (raw.flags.count("deterministic")) spec->options.deterministic = true;
  if (raw.has("input-scale")) {
    const std::string& t = raw.values.at("input-scale");
    char* end = nullptr;
    const double x = std::strtod(t.c_str(), &end);
    const bool decimal = !t.empty() && t.find_first_not_of("0123456789.eE+-") == std::string::npos;
    if (!decimal || end != t.c_str() + t.size() || !std::isfinite(x) || !(x > 0))
      return bad("--input-scale '" + t + "': expected a finite number > 0");
    spec->input_scale = x;
  }
  spec->input_plants.clear();
  if (raw.has("plant-input")) {
    const std::string& t = raw.values.at("plant-input");
    std::istringstream items(t);
    std::string item;
    while (std::getline(items, item, ',')) {
      std::vector<std::string> parts;
      std::istringstream fields(item);
      for (std::string f; std::getline(fields, f, ':');) parts.push_back(f);
      harness::CaseSpec::InputPlant pl;
      const bool tensor_ok =
          parts.size() == 3 && (parts[0] == "q" || parts[0] == "k" || parts[0] == "v" || parts[0] == "do");
      const bool value_ok = parts.size() == 3 && (parts[2] == "nan" || parts[2] == "inf" || parts[2] == "-inf");
      if (!tensor_ok || !value_ok || !parse_int("plant-input", parts[1], &pl.index).ok() || pl.index < 0)
        return bad("--plant-input '" + t +
                   "': expected TENSOR:INDEX:VALUE items separated by commas, "
                   "TENSOR one of q, k, v, do, INDEX >= 0, VALUE one of nan, inf, -inf");
      pl.tensor = parts[0];
      pl.value = parts[2] == "nan" ? std::nan("") : parts[2] == "inf" ? HUGE_VAL : -HUGE_VAL;
      spec->input_plants.push_back(pl);
    }
  }

  // Views: the layout's, overridden by explicit ones.
  spec->sizes = z;
  spec->grad = grad;
  const std::vector<std::string> needed = grad ? std::vector<std::string>{"q", "k", "v", "o", "do", "dq", "dk", "dv"}
                                               : std::vector<std::string>{"q", "k", "v", "o"};
  const bool all_explicit =
      std::all_of(needed.begin(), needed.end(), [&](const std::string& t) { return views.count(t) > 0; });
  LayoutViews lv;
  Status ls = make_layout_views(layout, z, &lv);
  if (!ls.ok()) {
    if (!all_explicit || raw.has("layout")) return ls;
    spec->layout_name.clear();
  } else {
    spec->layout_name = layout;
  }
  if (all_explicit && !raw.has("layout") && !preset) spec->layout_name.clear();
  spec->views = lv;
  std::map<std::string, ViewSpec*> slot = {{"q", &spec->views.q},   {"k", &spec->views.k},    {"v", &spec->views.v},
                                           {"o", &spec->views.o},   {"do", &spec->views.d_o}, {"dq", &spec->views.dq},
                                           {"dk", &spec->views.dk}, {"dv", &spec->views.dv}};
  for (const auto& [name, v] : views) *slot.at(name) = v;
  return resolve_features(raw.values, raw.flags, grad, spec);
}

}  // namespace

Status parse_view(const std::string& option, const std::string& text, ViewSpec* out, const char* dims) {
  const std::string example = "e.g. qkv+16:1,2048,1,64:1152,1152,64,1";
  auto fail = [&](const std::string& why) {
    return bad("--" + option + " '" + text + "': " + why +
               "; expected BUF+OFFSET:SHAPE:STRIDES with 4 shape and 4 stride values (" + dims + "), " + example);
  };
  const std::size_t c1 = text.find(':');
  if (c1 == std::string::npos) return fail("missing ':'");
  const std::size_t c2 = text.find(':', c1 + 1);
  if (c2 == std::string::npos) return fail("missing the second ':'");
  if (text.find(':', c2 + 1) != std::string::npos) return fail("too many ':'");
  std::string head = text.substr(0, c1);
  ViewSpec v;
  const std::size_t plus = head.find('+');
  v.buffer = head.substr(0, plus);
  if (v.buffer.empty()) return fail("missing buffer name");
  for (char ch : v.buffer)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-'))
      return fail("buffer name '" + v.buffer + "' may hold only letters, digits, '_' and '-'");
  if (plus != std::string::npos) {
    const std::string off = head.substr(plus + 1);
    const char* end = off.data() + off.size();
    auto [p, ec] = std::from_chars(off.data(), end, v.offset);
    if (off.empty() || ec != std::errc() || p != end) return fail("offset '" + off + "' is not an integer");
    if (v.offset < 0) return fail("offset " + off + " is negative");
  }
  std::vector<std::int64_t> shape, stride;
  if (!parse_list(option, text.substr(c1 + 1, c2 - c1 - 1), &shape).ok() || shape.size() != 4)
    return fail("shape must be 4 integers");
  if (!parse_list(option, text.substr(c2 + 1), &stride).ok() || stride.size() != 4)
    return fail("strides must be 4 integers");
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = shape[i];
    v.stride[i] = stride[i];
  }
  const auto pos = [](std::int64_t x) { return std::max<std::int64_t>(x, 0); };
  if (!harness::checked_product({pos(shape[0]), pos(shape[1]), pos(shape[2]), pos(shape[3])}))
    return fail("the shape has more than 2^63 - 1 elements");
  *out = v;
  return Status::Ok();
}

Status parse_command_line(const std::vector<std::string>& args, Invocation* out) {
  Invocation inv;
  if (args.empty()) {
    inv.command = Command::demo;
    *out = std::move(inv);
    return Status::Ok();
  }
  const std::string& first = args[0];
  if (first == "check")
    inv.command = Command::check;
  else if (first == "explain")
    inv.command = Command::explain;
  else if (first == "bench")
    inv.command = Command::bench;
  else if (first == "fuzz")
    inv.command = Command::fuzz;
  else if (first == "help" || first == "--help" || first == "-h")
    inv.command = Command::help;
  else if (first == "--version")
    inv.command = Command::version;
  else if (first == "--gpu-available")
    inv.command = Command::gpu_available;
  else
    return bad("unknown command '" + first +
               "'; expected check, explain, bench or fuzz (no arguments runs the demo; --help "
               "lists the options)");
  if (inv.command == Command::help || inv.command == Command::version || inv.command == Command::gpu_available) {
    if (args.size() > 1) return bad("'" + first + "' takes no further arguments");
    *out = std::move(inv);
    return Status::Ok();
  }

  const CommandOptions allowed = options_of(inv.command);
  RawProblem raw;
  std::map<std::string, std::string> values;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      inv.command = Command::help;
      *out = std::move(inv);
      return Status::Ok();
    }
    if (a.rfind("--", 0) != 0 || a.size() == 2)
      return bad("unexpected argument '" + a + "' for '" + first + "'; options start with --");
    std::string name = a.substr(2), value;
    bool has_value = false;
    if (const std::size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    const bool problem_valued = allowed.problem && kProblemValued.count(name);
    const bool problem_flag = allowed.problem && kProblemFlags.count(name);
    const bool valued = problem_valued || allowed.valued.count(name);
    const bool flag = problem_flag || allowed.flags.count(name);
    if (!valued && !flag) {
      if (!allowed.problem && (kProblemValued.count(name) || kProblemFlags.count(name)))
        return bad("option --" + name + " is not taken by '" + first + "' (fuzz draws its own problems)");
      return bad("unknown option --" + name + " for '" + first + "'; see strideattn --help");
    }
    if (flag) {
      if (has_value) return bad("option --" + name + " takes no value");
      if (problem_flag) raw.flags.insert(name);
      if (name == "grad") inv.grad = true;
      if (name == "json") inv.json = true;
      if (name == "require-gpu") inv.require_gpu = true;
      if (name == "require-ran") inv.require_ran = true;
      if (name == "finite-inputs") inv.finite_inputs = true;
      if (name == "features") inv.features = true;
      if (name == "cu-seqlens") inv.cu_seqlens = true;
      if (name == "via-plan") inv.via_plan = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size()) return bad("option --" + name + " needs a value");
      value = args[++i];
    }
    // Every valued option at most once (a repeated --mask silently took the last one).
    std::map<std::string, std::string>& into = problem_valued ? raw.values : values;
    if (into.count(name))
      return bad("option --" + name + " given twice ('" + into.at(name) + "' and '" + value + "'); give it once");
    into[name] = value;
  }

  if (values.count("backends")) {
    if (Status s = parse_backends(values.at("backends"), &inv.backends); !s.ok()) return s;
    inv.backends_given = true;
  }
  if (values.count("seed")) {
    std::int64_t s = 0;
    if (Status st = parse_int("seed", values.at("seed"), &s); !st.ok()) return st;
    if (s < 0) return bad("--seed " + values.at("seed") + ": must not be negative");
    inv.seed = std::uint64_t(s);
    inv.seed_given = true;
  }
  if (values.count("test-plant")) {
    const std::string& t = values.at("test-plant");
    std::vector<std::string> parts;
    std::string item;
    std::istringstream is(t);
    while (std::getline(is, item, ':')) parts.push_back(item);
    harness::CaseSpec::Plant pl;
    char* end = nullptr;
    if (parts.size() != 4 || !parse_int("test-plant", parts[2], &pl.index).ok())
      return bad("--test-plant '" + t + "': expected KIND:TENSOR:INDEX:DELTA");
    pl.kind = parts[0];
    pl.tensor = parts[1];
    pl.delta = std::strtod(parts[3].c_str(), &end);
    inv.plant = pl;
  }
  if (values.count("runs")) {
    std::int64_t r = 0;
    if (Status st = parse_int("runs", values.at("runs"), &r); !st.ok()) return st;
    if (r < 20 || r > 100000) return bad("--runs " + values.at("runs") + ": must be 20..100000");
    inv.bench_runs = int(r);
  }
  if (inv.command == Command::fuzz) {
    if (!values.count("cases")) return bad("fuzz needs --cases N (how many random problems)");
    if (Status st = parse_int("cases", values.at("cases"), &inv.cases); !st.ok()) return st;
    if (inv.cases < 0) return bad("--cases " + values.at("cases") + ": must not be negative");
    inv.cases_given = true;
    if (values.count("min-ran")) {
      if (Status st = parse_int("min-ran", values.at("min-ran"), &inv.min_ran); !st.ok()) return st;
      if (inv.min_ran < 0 || inv.min_ran > 1000000)
        return bad("--min-ran " + values.at("min-ran") + ": must be 0..1000000");
    }
    if (values.count("logit-limit")) {
      const std::string& t = values.at("logit-limit");
      char* end = nullptr;
      const double x = std::strtod(t.c_str(), &end);
      if (t.empty() || *end != '\0' || !(x >= 1) || !std::isfinite(x))
        return bad("--logit-limit '" + t + "': expected a finite number >= 1");
      inv.logit_limit = x;
    }
  } else {
    if (Status s = resolve_problem(raw, inv.grad, &inv.spec); !s.ok()) return s;
    inv.spec.seed = inv.seed;
    inv.spec.plant = inv.plant;
    if (inv.cu_seqlens && !inv.spec.sizes.varlen())
      return bad(
          "--cu-seqlens passes varlen lengths as cu_seqlens arrays; the problem is not varlen (give "
          "--seqlens-q, or a varlen preset)");
    inv.spec.cu_seqlens = inv.cu_seqlens;
    inv.spec.via_plan = inv.via_plan;
  }
  *out = std::move(inv);
  return Status::Ok();
}

Status check_environment() {
  const char* env = std::getenv("STRIDEATTN_BACKEND");
  if (env == nullptr || *env == '\0' || backend_from_string(env)) return Status::Ok();
  return bad(std::string("STRIDEATTN_BACKEND='") + env +
             "' is not a backend; supported: auto, reference, cpu, cuda, cudnn (or unset)");
}

std::vector<Backend> available_backends() {
  std::vector<Backend> out;
  for (Backend b : kConcreteBackends) {
    if (!backend_compiled(b)) continue;
    if ((b == Backend::cuda || b == Backend::cudnn) && !harness::gpu_available()) continue;
    out.push_back(b);
  }
  return out;
}

std::vector<Backend> default_backends() {
  std::vector<Backend> out;
  for (Backend b : available_backends())
    if (b != Backend::reference) out.push_back(b);
  if (out.empty()) out.push_back(Backend::reference);
  return out;
}

std::string describe_problem(const harness::CaseSpec& spec) {
  const ProblemSizes& z = spec.sizes;
  std::ostringstream os;
  os << to_string(spec.dtype);
  auto list = [](const std::vector<std::int64_t>& v) {
    std::string s;
    for (std::int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
  };
  if (z.varlen()) {
    os << " varlen seqlens_q=[" << list(z.seqlens_q) << "] seqlens_kv=[" << list(z.seqlens_kv) << "]";
    if (!z.offsets_q.empty()) os << " offsets_q=[" << list(z.offsets_q) << "]";
    if (!z.offsets_kv.empty()) os << " offsets_kv=[" << list(z.offsets_kv) << "]";
  } else {
    os << " b=" << z.batch << " s_q=" << z.s_q << " s_kv=" << z.s_kv;
  }
  os << " h=" << z.heads << " hg=" << z.kv_heads << " d_qk=" << z.d_qk << " d_v=" << z.d_v
     << " mask=" << to_string(spec.options.mask);
  if (!spec.options.window.unbounded())
    os << " window=(" << spec.options.window.left << "," << spec.options.window.right << ")";
  if (spec.options.scale) os << " scale=" << *spec.options.scale;
  if (spec.options.deterministic) os << " deterministic";
  os << describe_features(spec);
  return os.str();
}

}  // namespace strideattn::cli

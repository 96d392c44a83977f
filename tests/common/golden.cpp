#include "golden.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/npy.hpp"

namespace ringattn::testing {

// The data dir is compiled in; RINGATTN_TEST_DATA_DIR in the environment overrides it, so a
// build carried to another machine (the GPU runs, bench/gpu/device_run.sh) finds its data.
std::string golden_dir() {
  const char* env = std::getenv("RINGATTN_TEST_DATA_DIR");
  return std::string(env && *env ? env : RINGATTN_TEST_DATA_DIR) + "/golden";
}

std::vector<std::string> golden_case_names(const std::string& mode_filter) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(golden_dir())) {
    if (!e.is_directory()) continue;
    std::ifstream f(e.path() / "case.json");
    auto j = nlohmann::json::parse(f);
    if (mode_filter.empty() || j.at("mode").get<std::string>() == mode_filter)
      names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

GoldenCase load_golden(const std::string& name) {
  GoldenCase c;
  c.name = name;
  c.dir = golden_dir() + "/" + name;
  std::ifstream f(c.dir + "/case.json");
  auto j = nlohmann::json::parse(f);
  c.mode = j.at("mode").get<std::string>();
  auto shape = j.at("shape").get<std::vector<int64_t>>();
  c.cfg.shape = {shape.at(0), shape.at(1), shape.at(2), shape.at(3)};
  c.cfg.causal = j.at("causal").get<bool>();
  c.cfg.scale = j.at("scale").get<double>();
  if (c.mode == "grouped" || c.mode == "mixture") {
    c.cfg.attention = AttentionKind::dilated;
    c.cfg.combine = c.mode == "grouped" ? Combine::grouped : Combine::mixture;
    c.cfg.segments = j.at("segments").get<std::vector<int64_t>>();
    c.cfg.dilations = j.at("dilations").get<std::vector<int64_t>>();
  } else {
    c.block_size = j.at("block_size").get<int64_t>();
    c.block_mask = read_npy_bool(c.dir + "/block_mask.npy");
  }
  auto load = [&](const char* file) { return read_npy_float(c.dir + "/" + file); };
  c.q = load("q.npy");
  c.k = load("k.npy");
  c.v = load("v.npy");
  c.dout = load("dout.npy");
  c.out = load("out.npy");
  c.dq = load("dq.npy");
  c.dk = load("dk.npy");
  c.dv = load("dv.npy");
  return c;
}

std::vector<std::string> golden_run_args(const GoldenCase& c) {
  auto join = [](const std::vector<int64_t>& v) {
    std::string s;
    for (auto x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
  };
  std::ostringstream scale;
  scale.precision(17);  // round-trips the double exactly
  scale << *c.cfg.scale;
  std::vector<std::string> a = {"run",
                                "--q",
                                c.dir + "/q.npy",
                                "--k",
                                c.dir + "/k.npy",
                                "--v",
                                c.dir + "/v.npy",
                                "--dout",
                                c.dir + "/dout.npy",
                                "--attention",
                                "dilated",
                                "--combine",
                                c.mode,
                                "--segments",
                                join(c.cfg.segments),
                                "--dilations",
                                join(c.cfg.dilations),
                                "--scale",
                                scale.str()};
  if (c.cfg.causal) a.push_back("--causal");
  return a;
}

}  // namespace ringattn::testing

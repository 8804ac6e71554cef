// deploy/: every YAML file parses; the Kubernetes manifests, the systemd units, their example
// configs and the image recipe agree with each other and with the programs: configs load through
// the real loaders (kvnode::node, kvnode::controller), ports, probes, URLs and images match.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kvnode/controller/config.hpp"
#include "kvnode/node/node_config.hpp"

namespace {

namespace fs = std::filesystem;
const fs::path kDeploy = KVNODE_DEPLOY_DIR;
const fs::path kSource = KVNODE_SOURCE_DIR;

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every match of `re`'s first group in `text`.
std::vector<std::string> captures(const std::string& text, const std::string& re) {
  std::vector<std::string> out;
  const std::regex r(re);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), r); it != std::sregex_iterator();
       ++it)
    out.push_back((*it)[1].str());
  return out;
}

struct CommandResult {
  int rc = -1;
  std::string out;
};

// Runs a shell command, stdout and stderr together.
CommandResult run(const std::string& command) {
  CommandResult r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), buf.size(), p)) r.out += buf.data();
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool on_path(const std::string& tool) {
  return run("command -v " + tool + " >/dev/null").rc == 0;
}

// A file in a fresh temporary folder, removed with the object.
class TempFile {
 public:
  TempFile(const std::string& name, const std::string& text) {
    static int counter = 0;
    dir_ = fs::temp_directory_path() /
           ("kvnode-deploy-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(dir_);
    std::ofstream(dir_ / name) << text;
    path_ = dir_ / name;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  std::string path() const { return path_.string(); }

 private:
  fs::path dir_, path_;
};

std::vector<fs::path> files_under(const fs::path& dir, const std::set<std::string>& extensions) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && extensions.count(e.path().extension().string()))
      out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// ---- Kubernetes documents ----

struct Doc {
  fs::path file;
  YAML::Node node;
};

std::string str(const YAML::Node& n) {
  return n && n.IsScalar() ? n.Scalar() : std::string();
}

// Every Kubernetes object under deploy/k8s (Kustomization files excluded).
std::vector<Doc> k8s_objects() {
  std::vector<Doc> out;
  for (const auto& f : files_under(kDeploy / "k8s", {".yaml", ".yml"}))
    for (const YAML::Node& d : YAML::LoadAllFromFile(f.string()))
      if (d.IsMap() && d["kind"] && str(d["kind"]) != "Kustomization") out.push_back({f, d});
  return out;
}

const YAML::Node* find_object(const std::vector<Doc>& docs, const std::string& kind,
                              const std::string& name) {
  for (const Doc& d : docs)
    if (str(d.node["kind"]) == kind && str(d.node["metadata"]["name"]) == name) return &d.node;
  return nullptr;
}

// Pod templates of the workloads, with the object that holds each.
std::vector<std::pair<const Doc*, YAML::Node>> pod_templates(const std::vector<Doc>& docs) {
  std::vector<std::pair<const Doc*, YAML::Node>> out;
  for (const Doc& d : docs) {
    const std::string kind = str(d.node["kind"]);
    if (kind == "Deployment" || kind == "DaemonSet" || kind == "StatefulSet")
      out.emplace_back(&d, d.node["spec"]["template"]);
  }
  return out;
}

std::vector<YAML::Node> containers_of(const YAML::Node& pod_spec) {
  std::vector<YAML::Node> out;
  for (const char* key : {"initContainers", "containers"})
    if (pod_spec[key])
      for (const YAML::Node& c : pod_spec[key]) out.push_back(c);
  return out;
}

// The binary a container runs ("" when it leaves it to the image).
std::string program_of(const YAML::Node& c) {
  return c["command"] && c["command"].size() > 0 ? str(c["command"][0]) : std::string();
}

bool runs(const YAML::Node& c, const std::string& binary) {
  const std::string p = program_of(c);
  return p.size() >= binary.size() + 1 && p.substr(p.size() - binary.size() - 1) == "/" + binary;
}

// The containerPort named `name` (-1 when absent).
int container_port(const YAML::Node& c, const std::string& name) {
  if (c["ports"])
    for (const YAML::Node& p : c["ports"])
      if (str(p["name"]) == name) return p["containerPort"].as<int>();
  return -1;
}

bool selector_matches(const YAML::Node& selector, const YAML::Node& labels) {
  if (!selector || !selector.IsMap() || selector.size() == 0 || !labels) return false;
  for (const auto& kv : selector)
    if (str(labels[kv.first.Scalar()]) != kv.second.Scalar()) return false;
  return true;
}

// The Service selecting the pods that run `binary`.
const YAML::Node* service_for(const std::vector<Doc>& docs, const std::string& binary) {
  for (const Doc& d : docs) {
    if (str(d.node["kind"]) != "Service") continue;
    for (const auto& [owner, tpl] : pod_templates(docs))
      if (selector_matches(d.node["spec"]["selector"], tpl["metadata"]["labels"]))
        for (const YAML::Node& c : containers_of(tpl["spec"]))
          if (runs(c, binary)) return &d.node;
  }
  return nullptr;
}

int service_port(const YAML::Node& svc, const std::string& name) {
  for (const YAML::Node& p : svc["spec"]["ports"])
    if (str(p["name"]) == name) return p["port"].as<int>();
  return -1;
}

// The resolved port of a probe's httpGet (named or numbered), -1 when unknown.
int probe_port(const YAML::Node& c, const YAML::Node& probe) {
  const YAML::Node port = probe["httpGet"]["port"];
  int n = 0;
  if (YAML::convert<int>::decode(port, n)) return n;
  return container_port(c, str(port));
}

// The ConfigMap item a container reads at `path` through a volumeMount, or "" when `path` is not
// a ConfigMap file of this pod.
std::string configmap_text(const std::vector<Doc>& docs, const YAML::Node& pod_spec,
                           const YAML::Node& c, const std::string& path) {
  for (const YAML::Node& m : c["volumeMounts"]) {
    const std::string mount = str(m["mountPath"]);
    if (path.rfind(mount + "/", 0) != 0) continue;
    const std::string file = path.substr(mount.size() + 1);
    for (const YAML::Node& v : pod_spec["volumes"]) {
      if (str(v["name"]) != str(m["name"]) || !v["configMap"]) continue;
      const YAML::Node* cm = find_object(docs, "ConfigMap", str(v["configMap"]["name"]));
      if (!cm) return "";
      std::string key = file;
      if (v["configMap"]["items"]) {
        key.clear();
        for (const YAML::Node& item : v["configMap"]["items"])
          if (str(item["path"]) == file) key = str(item["key"]);
      }
      return key.empty() ? "" : str((*cm)["data"][key]);
    }
  }
  return "";
}

// A container's argv as Kubernetes runs it: $(VAR) replaced by a stand-in for the variable's
// value (an address for IP fields, a name otherwise).
std::vector<std::string> argv_of(const YAML::Node& c) {
  std::map<std::string, std::string> env;
  for (const YAML::Node& e : c["env"]) {
    const YAML::Node from = e["valueFrom"];
    const std::string field = from && from["fieldRef"] ? str(from["fieldRef"]["fieldPath"]) : "";
    env[str(e["name"])] = e["value"]                              ? str(e["value"])
                          : field.find("IP") != std::string::npos ? "10.1.2.3"
                                                                  : "name-a";
  }
  std::vector<std::string> argv;
  for (const char* key : {"command", "args"})
    for (const YAML::Node& a : c[key]) argv.push_back(str(a));
  const std::regex var(R"re(\$\(([A-Za-z_][A-Za-z0-9_]*)\))re");
  for (std::string& a : argv) {
    std::smatch m;
    while (std::regex_search(a, m, var)) {
      const auto it = env.find(m[1].str());
      if (it == env.end()) {
        ADD_FAILURE() << "argument '" << a << "' names $(" << m[1]
                      << "), not in the container's env";
        break;
      }
      a = m.prefix().str() + it->second + m.suffix().str();
    }
  }
  return argv;
}

// argv with "--config X" / "--config=X" replaced by `file` (X returned in `config_path`).
std::vector<std::string> with_config(std::vector<std::string> argv, const std::string& file,
                                     std::string& config_path) {
  for (std::size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--config" && i + 1 < argv.size()) {
      config_path = argv[i + 1];
      argv[i + 1] = file;
    } else if (argv[i].rfind("--config=", 0) == 0) {
      config_path = argv[i].substr(9);
      argv[i] = "--config=" + file;
    }
  }
  return argv;
}

std::string config_arg(const std::vector<std::string>& argv) {
  std::string path;
  with_config(argv, "", path);
  return path;
}

// Bytes of a Kubernetes quantity such as 17Gi or 512M (0 when unreadable).
double quantity_bytes(const std::string& q) {
  static const std::map<std::string, double> kUnits = {
      {"", 1},           {"k", 1e3},           {"M", 1e6},
      {"G", 1e9},        {"T", 1e12},          {"Ki", 1024.0},
      {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0}};
  std::size_t end = 0;
  double n = 0;
  try {
    n = std::stod(q, &end);
  } catch (...) {
    return 0;
  }
  const auto it = kUnits.find(q.substr(end));
  return it == kUnits.end() ? 0 : n * it->second;
}

kvnode::controller::EnvLookup no_env() {
  return [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
}

// Loads a controller config file (and flags) through kvcontroller's loader.
std::optional<kvnode::controller::ControllerConfig> load_controller(std::vector<std::string> argv) {
  auto r = kvnode::controller::load_config(argv, no_env());
  if (!r) {
    ADD_FAILURE() << "kvcontroller rejects it: " << r.error().message;
    return std::nullopt;
  }
  if (!r->config) ADD_FAILURE() << "kvcontroller exits: " << r->message;
  return r->config;
}

std::optional<kvnode::node::NodeConfig> load_node(const std::vector<std::string>& argv) {
  auto r = kvnode::node::load_node_config(argv);
  if (!r) {
    ADD_FAILURE() << "kvnode rejects it: " << r.error().message;
    return std::nullopt;
  }
  if (!r->config) ADD_FAILURE() << "kvnode exits: " << r->message;
  return r->config;
}

// The keys kvnode reads from its YAML file (it accepts LMCache's others and ignores them, so an
// LMCache key kvnode has no use for would pass the loader unnoticed).
std::set<std::string> node_yaml_keys() {
  std::set<std::string> keys;
  for (const auto& setting : kvnode::node::node_settings()) keys.insert(setting.key);
  return keys;
}

void expect_known_node_keys(const std::string& yaml, const std::string& where) {
  const std::set<std::string> known = node_yaml_keys();
  ASSERT_GT(known.size(), 10u) << "node_settings() lists too few keys";
  for (const auto& kv : YAML::Load(yaml))
    EXPECT_TRUE(known.count(kv.first.Scalar()))
        << where << ": kvnode reads no key '" << kv.first.Scalar() << "'";
}

// GET paths a program serves: the controller's get("...") routes, the node's http->get("...").
std::set<std::string> get_paths(const fs::path& source, const std::string& re) {
  const auto paths = captures(read_text(source), re);
  return {paths.begin(), paths.end()};
}

std::set<std::string> controller_get_paths() {
  return get_paths(kSource / "control/controller/http_api.cpp", R"re(\bget\("([^"]+)")re");
}

std::set<std::string> node_get_paths() {
  return get_paths(kSource / "node/src/daemon.cpp", R"re(http->get\("([^"]+)")re");
}

std::string namespace_of_base() {
  return str(YAML::LoadFile((kDeploy / "k8s/base/kustomization.yaml").string())["namespace"]);
}

// "host:port" -> {host, port}.
std::pair<std::string, int> split_url(const std::string& url) {
  const auto colon = url.rfind(':');
  if (colon == std::string::npos) return {url, -1};
  return {url.substr(0, colon), std::atoi(url.substr(colon + 1).c_str())};
}

bool names_service(const std::string& host, const std::string& svc, const std::string& ns) {
  return host == svc || host == svc + "." + ns || host == svc + "." + ns + ".svc" ||
         host == svc + "." + ns + ".svc.cluster.local";
}

void expect_prometheus(const YAML::Node& tpl, int http_port, const std::set<std::string>& gets,
                       const std::string& where) {
  const YAML::Node a = tpl["metadata"]["annotations"];
  EXPECT_EQ(str(a["prometheus.io/scrape"]), "true") << where;
  EXPECT_EQ(str(a["prometheus.io/port"]), std::to_string(http_port)) << where;
  EXPECT_EQ(str(a["prometheus.io/path"]), "/metrics") << where;
  EXPECT_TRUE(gets.count("/metrics")) << where << ": the program serves no GET /metrics";
}

void expect_probes(const YAML::Node& c, int http_port, const std::set<std::string>& gets,
                   const std::string& where) {
  int probes = 0;
  for (const char* kind : {"readinessProbe", "livenessProbe", "startupProbe"}) {
    const YAML::Node p = c[kind];
    if (!p) continue;
    ++probes;
    const std::string path = str(p["httpGet"]["path"]);
    EXPECT_TRUE(gets.count(path)) << where << " " << kind << ": no GET " << path;
    EXPECT_EQ(probe_port(c, p), http_port) << where << " " << kind << " port";
  }
  EXPECT_GE(probes, 2) << where << ": liveness and readiness (or startup) probes";
}

// ---- The Dockerfile ----

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (auto at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

struct Stage {
  std::string from;
  std::vector<std::string> lines;  // continuation lines joined
};

std::vector<Stage> dockerfile_stages() {
  std::vector<Stage> stages;
  std::map<std::string, std::string> args;  // ARG defaults before the first FROM
  std::istringstream in(read_text(kDeploy / "docker/Dockerfile"));
  std::string line, joined;
  while (std::getline(in, line)) {
    if (line.rfind('#', 0) == 0) continue;
    joined += line;
    if (!joined.empty() && joined.back() == '\\') {
      joined.pop_back();
      joined += ' ';
      continue;
    }
    if (joined.rfind("FROM ", 0) == 0) {
      std::string from = joined.substr(5);
      for (const auto& [name, value] : args) from = replace_all(from, "${" + name + "}", value);
      stages.push_back({from, {}});
    } else if (stages.empty() && joined.rfind("ARG ", 0) == 0 &&
               joined.find('=') != std::string::npos) {
      const auto eq = joined.find('=');
      args[joined.substr(4, eq - 4)] = joined.substr(eq + 1);
    } else if (!stages.empty() && !joined.empty())
      stages.back().lines.push_back(joined);
    joined.clear();
  }
  return stages;
}

// The packages a stage's `apt-get install` names (variables left out).
std::set<std::string> apt_packages(const Stage& s) {
  std::set<std::string> out;
  for (const std::string& l : s.lines) {
    const auto at = l.find("apt-get install");
    if (at == std::string::npos) continue;
    std::istringstream words(l.substr(at + 15));
    std::string w;
    while (words >> w && w != "&&")
      if (w[0] != '-' && w.find('$') == std::string::npos) out.insert(w);
  }
  return out;
}

const Stage* runtime_stage(const std::vector<Stage>& stages) {
  return stages.empty() ? nullptr : &stages.back();
}

// "kvnode:0.1.0" from the runtime stage's OCI labels.
std::string image_name() {
  const std::string text = read_text(kDeploy / "docker/Dockerfile");
  const auto title = captures(text, R"re(org\.opencontainers\.image\.title="([^"]+)")re");
  const auto version = captures(text, R"re(org\.opencontainers\.image\.version="([^"]+)")re");
  if (title.size() != 1 || version.size() != 1) return "";
  return title[0] + ":" + version[0];
}

// ---- Tests ----

TEST(DeployYaml, EveryFileParses) {
  const auto files = files_under(kDeploy, {".yaml", ".yml"});
  EXPECT_GE(files.size(), 9u) << "deploy/ should hold the k8s manifests and the example configs";
  for (const fs::path& f : files) {
    std::vector<YAML::Node> docs;
    try {
      docs = YAML::LoadAllFromFile(f.string());
    } catch (const YAML::Exception& e) {
      ADD_FAILURE() << f << ": " << e.what();
      continue;
    }
    EXPECT_FALSE(docs.empty()) << f;
    for (const YAML::Node& d : docs) {
      EXPECT_TRUE(d.IsMap()) << f << ": a document that is not a mapping";
      // Files carried inside ConfigMaps are YAML too.
      if (d.IsMap() && str(d["kind"]) == "ConfigMap")
        for (const auto& kv : d["data"]) {
          const std::string key = kv.first.Scalar();
          if (key.size() > 5 && key.substr(key.size() - 5) == ".yaml") {
            EXPECT_NO_THROW((void)YAML::Load(kv.second.Scalar())) << f << " data." << key;
          }
        }
    }
  }
}

TEST(DeployKustomize, ResourcesExistAndEveryManifestIsUsed) {
  std::set<fs::path> used;
  const auto kustomizations = files_under(kDeploy / "k8s", {".yaml"});
  int count = 0;
  for (const fs::path& f : kustomizations) {
    if (f.filename() != "kustomization.yaml") continue;
    ++count;
    used.insert(fs::weakly_canonical(f));
    for (const YAML::Node& r : YAML::LoadFile(f.string())["resources"]) {
      const fs::path p = fs::weakly_canonical(f.parent_path() / str(r));
      EXPECT_TRUE(fs::is_regular_file(p) || fs::is_regular_file(p / "kustomization.yaml"))
          << f << ": resource " << str(r) << " does not exist";
      used.insert(p);
    }
  }
  EXPECT_GE(count, 2) << "the base and the sidecar example";
  for (const fs::path& f : kustomizations)
    EXPECT_TRUE(used.count(fs::weakly_canonical(f))) << f << " is in no kustomization";
}

TEST(DeployKustomize, KubectlBuildsEveryKustomization) {
  if (!on_path("kubectl")) GTEST_SKIP() << "kubectl is not installed; `kubectl kustomize` not run";
  for (const fs::path& f : files_under(kDeploy / "k8s", {".yaml"})) {
    if (f.filename() != "kustomization.yaml") continue;
    const CommandResult r = run("kubectl kustomize '" + f.parent_path().string() + "'");
    EXPECT_EQ(r.rc, 0) << f.parent_path() << ":\n" << r.out;
  }
}

TEST(DeployK8s, ServicePortsExistOnTheirPods) {
  const auto docs = k8s_objects();
  int services = 0;
  for (const Doc& d : docs) {
    if (str(d.node["kind"]) != "Service") continue;
    ++services;
    std::vector<YAML::Node> pods;
    for (const auto& [owner, tpl] : pod_templates(docs))
      if (selector_matches(d.node["spec"]["selector"], tpl["metadata"]["labels"]))
        pods.push_back(tpl);
    ASSERT_FALSE(pods.empty()) << d.file << ": Service " << str(d.node["metadata"]["name"])
                               << " selects no pod template";
    for (const YAML::Node& p : d.node["spec"]["ports"]) {
      const YAML::Node target = p["targetPort"] ? p["targetPort"] : p["port"];
      int number = 0;
      const bool numbered = YAML::convert<int>::decode(target, number);
      for (const YAML::Node& tpl : pods) {
        bool found = false;
        for (const YAML::Node& c : containers_of(tpl["spec"]))
          for (const YAML::Node& cp : c["ports"])
            found = found || (numbered ? cp["containerPort"].as<int>() == number
                                       : str(cp["name"]) == str(target));
        EXPECT_TRUE(found) << d.file << ": Service port " << str(p["name"]) << " targets "
                           << str(target) << ", which no container of its pods declares";
      }
    }
  }
  EXPECT_GE(services, 1);
}

TEST(DeployK8s, ControllerConfigLoadsAndMatchesDeploymentAndService) {
  const auto docs = k8s_objects();
  const YAML::Node* svc = service_for(docs, "kvcontroller");
  ASSERT_NE(svc, nullptr) << "no Service selects the kvcontroller pods";
  int checked = 0;
  for (const auto& [owner, tpl] : pod_templates(docs)) {
    for (const YAML::Node& c : containers_of(tpl["spec"])) {
      if (!runs(c, "kvcontroller")) continue;
      ++checked;
      const std::string where = owner->file.filename().string() + " " + str(c["name"]);
      const std::vector<std::string> argv = argv_of(c);
      const std::string path = config_arg(argv);
      const std::string yaml = configmap_text(docs, tpl["spec"], c, path);
      ASSERT_FALSE(yaml.empty()) << where << ": --config " << path << " is no ConfigMap file";
      TempFile file("kvcontroller.yaml", yaml);
      std::string ignored;
      const auto cfg = load_controller(with_config(argv, file.path(), ignored));
      ASSERT_TRUE(cfg) << where;
      const auto& ports = cfg->controller_monitor_ports;
      EXPECT_EQ(container_port(c, "http"), cfg->controller_port) << where;
      EXPECT_EQ(container_port(c, "pull"), ports.pull) << where;
      EXPECT_EQ(container_port(c, "reply"), ports.reply) << where;
      EXPECT_EQ(container_port(c, "heartbeat"), ports.heartbeat) << where;
      // Workers get heartbeat_url = advertise host : the controller's own heartbeat port.
      EXPECT_TRUE(names_service(cfg->controller_advertise_host, str((*svc)["metadata"]["name"]),
                                namespace_of_base()))
          << where << ": controller_advertise_host '" << cfg->controller_advertise_host
          << "' is not the controller Service";
      EXPECT_EQ(service_port(*svc, "heartbeat"), ports.heartbeat) << where;
      expect_probes(c, cfg->controller_port, controller_get_paths(), where);
      expect_prometheus(tpl, cfg->controller_port, controller_get_paths(), where);
      EXPECT_EQ(str(owner->node["spec"]["replicas"]), "1") << where << ": one controller";
    }
  }
  EXPECT_EQ(checked, 1) << "one kvcontroller container in deploy/k8s";
}

TEST(DeployK8s, NodeConfigLoadsAndMatchesPodsAndController) {
  const auto docs = k8s_objects();
  const YAML::Node* svc = service_for(docs, "kvcontroller");
  ASSERT_NE(svc, nullptr);
  const std::string svc_name = str((*svc)["metadata"]["name"]);
  const YAML::Node* cm = find_object(docs, "ConfigMap", "kvnode-config");
  ASSERT_NE(cm, nullptr);
  TempFile controller_file("kvcontroller.yaml", str((*cm)["data"]["kvcontroller.yaml"]));
  const auto controller = load_controller({"kvcontroller", "--config", controller_file.path()});
  ASSERT_TRUE(controller);
  int checked = 0;
  for (const auto& [owner, tpl] : pod_templates(docs)) {
    const YAML::Node spec = tpl["spec"];
    for (const YAML::Node& c : containers_of(spec)) {
      if (!runs(c, "kvnode")) continue;
      ++checked;
      const std::string where = owner->file.filename().string() + " " + str(c["name"]);
      const std::vector<std::string> argv = argv_of(c);
      const std::string yaml = configmap_text(docs, spec, c, config_arg(argv));
      ASSERT_FALSE(yaml.empty()) << where << ": its --config is no ConfigMap file";
      expect_known_node_keys(yaml, where);
      TempFile file("kvnode.yaml", yaml);
      std::string ignored;
      const auto cfg = load_node(with_config(argv, file.path(), ignored));
      ASSERT_TRUE(cfg) << where;
      const auto rank = static_cast<std::size_t>(cfg->worker_id);

      // Ports, probes, scraping.
      EXPECT_EQ(container_port(c, "http"), cfg->http_port) << where;
      ASSERT_LT(rank, cfg->lmcache_worker_ports.size()) << where;
      ASSERT_LT(rank, cfg->p2p_init_ports.size()) << where;
      EXPECT_EQ(container_port(c, "worker"), cfg->lmcache_worker_ports[rank]) << where;
      EXPECT_EQ(container_port(c, "p2p"), cfg->p2p_init_ports[rank]) << where;
      EXPECT_EQ(cfg->http_host, "0.0.0.0") << where << ": kubelet and Prometheus come from outside";
      expect_probes(c, cfg->http_port, node_get_paths(), where);
      expect_prometheus(tpl, cfg->http_port, node_get_paths(), where);

      // Reachable addresses, the controller Service's ports and chunking.
      EXPECT_NE(cfg->p2p_host, "127.0.0.1") << where << ": peers cannot dial loopback";
      EXPECT_NE(cfg->advertise_ip, "127.0.0.1") << where << ": the controller cannot dial loopback";
      const auto [pull_host, pull_port] = split_url(cfg->controller_pull_url);
      const auto [reply_host, reply_port] = split_url(cfg->controller_reply_url);
      EXPECT_TRUE(names_service(pull_host, svc_name, namespace_of_base()))
          << where << " " << pull_host;
      EXPECT_TRUE(names_service(reply_host, svc_name, namespace_of_base()))
          << where << " " << reply_host;
      EXPECT_EQ(pull_port, service_port(*svc, "pull")) << where;
      EXPECT_EQ(reply_port, service_port(*svc, "reply")) << where;
      EXPECT_EQ(cfg->chunk_size, controller->hashing.chunk_size) << where;

      // Host network needs cluster DNS for the Service name.
      if (spec["hostNetwork"] && spec["hostNetwork"].as<bool>()) {
        EXPECT_EQ(str(spec["dnsPolicy"]), "ClusterFirstWithHostNet") << where;
      }

      // Memory: IPC_LOCK, a limit above the pool and staging, UCX settings.
      bool ipc_lock = false;
      for (const YAML::Node& cap : c["securityContext"]["capabilities"]["add"])
        ipc_lock = ipc_lock || str(cap) == "IPC_LOCK";
      EXPECT_TRUE(ipc_lock) << where << ": IPC_LOCK";
      const double limit = quantity_bytes(str(c["resources"]["limits"]["memory"]));
      EXPECT_GE(limit, cfg->max_local_cpu_size * 1e9 +
                           static_cast<double>(cfg->local_staging_mb) * 1048576.0)
          << where << ": memory limit below the pool and the staging region";
      std::set<std::string> env;
      for (const YAML::Node& e : c["env"]) env.insert(str(e["name"]));
      EXPECT_TRUE(env.count("UCX_TLS") && env.count("UCX_NET_DEVICES")) << where;

      // The local socket's folder and /dev/shm are volumes, mounted alike in every container
      // of the pod that mounts one of them (the engine's).
      const fs::path socket_dir = fs::path(kvnode::node::local_socket_path(*cfg)).parent_path();
      std::map<std::string, std::string> mounts;  // mountPath -> volume
      for (const YAML::Node& m : c["volumeMounts"]) mounts[str(m["mountPath"])] = str(m["name"]);
      ASSERT_TRUE(mounts.count(socket_dir.string()))
          << where << ": " << socket_dir << " is no volume";
      ASSERT_TRUE(mounts.count("/dev/shm")) << where << ": /dev/shm is no volume";
      for (const YAML::Node& other : containers_of(spec)) {
        if (str(other["name"]) == str(c["name"])) continue;
        for (const YAML::Node& m : other["volumeMounts"])
          for (const std::string& shared : {socket_dir.string(), std::string("/dev/shm")})
            if (str(m["name"]) == mounts[shared]) {
              EXPECT_EQ(str(m["mountPath"]), shared) << where << ": " << str(other["name"]);
            }
      }
    }
  }
  EXPECT_GE(checked, 2) << "the DaemonSet and the sidecar example";
}

TEST(DeployImage, ManifestsRunTheDockerfilesImageAndBinaries) {
  const std::string image = image_name();
  ASSERT_FALSE(image.empty()) << "the Dockerfile's OCI title and version labels";
  EXPECT_EQ(image.substr(image.find(':') + 1), KVNODE_PROJECT_VERSION)
      << "the image version is the project's";
  const std::string dockerfile = read_text(kDeploy / "docker/Dockerfile");
  EXPECT_NE(dockerfile.find("-t " + image + " "), std::string::npos)
      << "the documented docker build command tags " << image;
  const auto stages = dockerfile_stages();
  ASSERT_GE(stages.size(), 2u) << "a build stage and a runtime stage";
  std::set<std::string> copied;
  for (const std::string& l : runtime_stage(stages)->lines)
    if (l.rfind("COPY ", 0) == 0) copied.insert(l.substr(l.rfind(' ') + 1));
  int kv_containers = 0;
  const auto docs = k8s_objects();  // pod_templates() points into it
  for (const auto& [owner, tpl] : pod_templates(docs))
    for (const YAML::Node& c : containers_of(tpl["spec"])) {
      const std::string program = program_of(c);
      if (program.find("/kv") == std::string::npos) continue;  // the engine's own image
      ++kv_containers;
      EXPECT_EQ(str(c["image"]), image) << owner->file.filename() << " " << str(c["name"]);
      EXPECT_TRUE(copied.count(program)) << program << " is not copied into the image";
    }
  EXPECT_GE(kv_containers, 3);
}

TEST(DeployImage, BuildStageInstallsOnlyDevShPackagesAndRuntimeIsNonRoot) {
  const auto stages = dockerfile_stages();
  ASSERT_GE(stages.size(), 2u);
  const auto dev = captures(read_text(kSource / "dev.sh"), R"re(PACKAGES=\(([^)]*)\))re");
  ASSERT_EQ(dev.size(), 1u) << "dev.sh's PACKAGES list";
  std::istringstream words(dev[0]);
  const std::set<std::string> dev_packages{std::istream_iterator<std::string>(words), {}};
  const std::set<std::string> build = apt_packages(stages.front());
  EXPECT_GE(build.size(), 10u);
  for (const std::string& p : build)
    EXPECT_TRUE(dev_packages.count(p)) << "build stage installs " << p << ", which dev.sh does not";
  std::string user;
  for (const std::string& l : runtime_stage(stages)->lines)
    if (l.rfind("USER ", 0) == 0) user = l.substr(5);
  EXPECT_FALSE(user.empty()) << "the runtime stage sets USER";
  EXPECT_TRUE(user != "root" && user.rfind("0:", 0) != 0 && user != "0") << user;
  EXPECT_NE(stages.back().from.find("debian:12-slim"), std::string::npos) << stages.back().from;
}

// soname -> the packages `dpkg -S` names for it, from lines "pkg:arch, pkg2:arch: /path/soname"
// (diversion lines skipped).
std::map<std::string, std::set<std::string>> packages_of(const std::string& dpkg_out) {
  std::map<std::string, std::set<std::string>> out;
  std::istringstream in(dpkg_out);
  std::string line;
  while (std::getline(in, line)) {
    const auto end = line.find(": /");
    if (end == std::string::npos || line.rfind("diversion", 0) == 0) continue;
    const std::string soname = fs::path(line.substr(end + 2)).filename().string();
    std::istringstream names(line.substr(0, end));
    std::string name;
    while (std::getline(names, name, ',')) {
      name.erase(0, name.find_first_not_of(' '));
      out[soname].insert(name.substr(0, name.find(':')));
    }
  }
  return out;
}

TEST(DeployImage, RuntimeStageHasEveryLibraryTheBinariesLoad) {
  if (!on_path("readelf") || !on_path("dpkg")) GTEST_SKIP() << "needs readelf and dpkg";
  const auto stages = dockerfile_stages();
  ASSERT_GE(stages.size(), 2u);
  std::set<std::string> have = apt_packages(*runtime_stage(stages));
  // debian:12-slim has these: apt itself depends on them.
  have.insert({"libc6", "libstdc++6", "libgcc-s1"});
  std::map<std::string, std::string> needed;  // soname -> a binary that loads it
  for (const std::string binary : {KVNODE_PATH, KVCONTROLLER_PATH, KVCTL_PATH}) {
    const CommandResult elf = run("readelf -d '" + binary + "'");
    ASSERT_EQ(elf.rc, 0) << binary << ": " << elf.out;
    const auto sonames = captures(elf.out, R"re(\(NEEDED\)\s+Shared library: \[([^\]]+)\])re");
    EXPECT_FALSE(sonames.empty()) << binary;
    for (const std::string& soname : sonames)
      // Sanitizer runtimes come with the compiler of an instrumented build only.
      if (soname.rfind("libasan", 0) != 0 && soname.rfind("libubsan", 0) != 0 &&
          soname.rfind("libclang_rt", 0) != 0)
        needed.emplace(soname, binary);
  }
  std::string patterns;
  for (const auto& [soname, binary] : needed) patterns += " '*/" + soname + "'";
  const CommandResult owners = run("dpkg -S" + patterns);
  const auto packages = packages_of(owners.out);
  for (const auto& [soname, binary] : needed) {
    const auto it = packages.find(soname);
    ASSERT_NE(it, packages.end()) << soname << ": no package has it\n" << owners.out;
    bool installed = false;
    for (const std::string& pkg : it->second) installed = installed || have.count(pkg);
    EXPECT_TRUE(installed) << binary << " needs " << soname << " (from " << *it->second.begin()
                           << "), which the runtime stage does not install";
  }
}

// ---- systemd ----

struct Unit {
  fs::path file;
  std::multimap<std::string, std::string> service;  // [Service] settings
  std::string exec_start;
};

Unit parse_unit(const fs::path& f) {
  Unit u{f, {}, {}};
  std::istringstream in(read_text(f));
  std::string line, joined, section;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    joined += line;
    if (joined.back() == '\\') {
      joined.pop_back();
      continue;
    }
    if (joined[0] == '[') {
      section = joined;
    } else if (section == "[Service]") {
      const auto eq = joined.find('=');
      if (eq != std::string::npos) u.service.emplace(joined.substr(0, eq), joined.substr(eq + 1));
    }
    joined.clear();
  }
  const auto it = u.service.find("ExecStart");
  if (it != u.service.end()) u.exec_start = it->second;
  return u;
}

std::vector<std::string> split_words(const std::string& s) {
  std::istringstream in(s);
  return {std::istream_iterator<std::string>(in), {}};
}

std::vector<Unit> units() {
  std::vector<Unit> out;
  for (const fs::path& f : files_under(kDeploy / "systemd", {".service"}))
    out.push_back(parse_unit(f));
  return out;
}

TEST(DeploySystemd, UnitsRunWhatTheExamplesConfigure) {
  const auto all = units();
  ASSERT_EQ(all.size(), 2u) << "kvcontroller.service and kvnode@.service";
  const fs::path examples = kDeploy / "systemd/examples";
  std::optional<kvnode::controller::ControllerConfig> controller;
  std::vector<kvnode::node::NodeConfig> nodes;
  for (const Unit& u : all) {
    const std::string name = u.file.filename().string();
    ASSERT_FALSE(u.exec_start.empty()) << name;
    ASSERT_EQ(u.service.count("Restart"), 1u) << name;
    EXPECT_EQ(u.service.find("Restart")->second, "on-failure") << name;
    // Exit 2 is a bad command line or config file: restarting cannot help.
    EXPECT_EQ(u.service.count("RestartPreventExitStatus"), 1u) << name;
    // Every file under /etc/kvnode the unit needs has an example.
    std::string needed = u.exec_start;  // and the EnvironmentFiles not marked optional ("-")
    for (const auto& [key, value] : u.service)
      if (key == "EnvironmentFile" && value[0] != '-') needed += " " + value;
    for (const std::string& path : captures(needed, R"re((/etc/kvnode/[^\s]+))re"))
      EXPECT_TRUE(fs::is_regular_file(examples / fs::path(path).filename()))
          << name << " reads " << path << ", which deploy/systemd/examples lacks";
    const bool is_node = name.rfind("kvnode@", 0) == 0;
    const std::vector<std::string> words = split_words(u.exec_start);
    EXPECT_EQ(words[0], is_node ? "/usr/local/bin/kvnode" : "/usr/local/bin/kvcontroller") << name;
    if (is_node) {
      ASSERT_EQ(u.service.count("LimitMEMLOCK"), 1u) << name;
      EXPECT_EQ(u.service.find("LimitMEMLOCK")->second, "infinity") << name;
      for (const std::string rank : {"0", "7"}) {
        std::vector<std::string> argv;
        for (const std::string& w : words)
          argv.push_back(
              replace_all(replace_all(w, "%i", rank), "/etc/kvnode/", examples.string() + "/"));
        expect_known_node_keys(read_text(examples / "kvnode.yaml"), name);
        const auto cfg = load_node(argv);
        ASSERT_TRUE(cfg) << name << " rank " << rank;
        EXPECT_EQ(std::to_string(cfg->worker_id), rank) << name;
        // The socket lives in the unit's RuntimeDirectory.
        const auto rt = u.service.find("RuntimeDirectory");
        ASSERT_NE(rt, u.service.end()) << name;
        EXPECT_EQ(fs::path(kvnode::node::local_socket_path(*cfg)).parent_path(),
                  "/run/" + rt->second);
        nodes.push_back(*cfg);
      }
    } else {
      std::vector<std::string> argv;
      for (const std::string& w : words)
        argv.push_back(replace_all(w, "/etc/kvnode/", examples.string() + "/"));
      controller = load_controller(argv);
    }
  }
  ASSERT_TRUE(controller);
  ASSERT_FALSE(nodes.empty());
  for (const auto& n : nodes) {
    EXPECT_EQ(split_url(n.controller_pull_url).second, controller->controller_monitor_ports.pull);
    EXPECT_EQ(split_url(n.controller_reply_url).second, controller->controller_monitor_ports.reply);
    EXPECT_EQ(n.chunk_size, controller->hashing.chunk_size);
  }
  EXPECT_NE(nodes.front().http_port, nodes.back().http_port) << "ranks need their own HTTP port";
}

TEST(DeploySystemd, SystemdAnalyzeVerifies) {
  if (!on_path("systemd-analyze"))
    GTEST_SKIP() << "systemd-analyze is not installed; units not verified";
  TempFile dir("README", "");
  const fs::path tmp = fs::path(dir.path()).parent_path();
  for (const Unit& u : units()) {
    std::string text = read_text(u.file);
    text = replace_all(text, "/usr/local/bin/kvcontroller", KVCONTROLLER_PATH);
    text = replace_all(text, "/usr/local/bin/kvnode", KVNODE_PATH);
    std::string name = u.file.filename().string();
    std::ofstream(tmp / name) << text;
    if (name.find("@.") != std::string::npos) {
      name.insert(name.find('@') + 1, "0");  // verify an instance of the template
      std::ofstream(tmp / name) << text;
    }
    const CommandResult r =
        run("cd '" + tmp.string() + "' && systemd-analyze verify './" + name + "'");
    EXPECT_EQ(r.rc, 0) << name << ":\n" << r.out;
    // Unknown keys and bad values are warnings: any line naming the unit fails the test.
    EXPECT_EQ(r.out.find(".service"), std::string::npos) << name << ":\n" << r.out;
  }
}

}  // namespace

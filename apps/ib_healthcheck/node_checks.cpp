// Node-local checks. Each reads the kernel's own view (/proc, /sys, statvfs) or UCX's, compares
// with the profile, and says in the note what it found when it fails.
#include "node_checks.hpp"

#include <dirent.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "hpct/comm/gpu.hpp"
#include "hpct/comm/ucx.hpp"
#include "hpct/core/units.hpp"

namespace hpct::healthcheck {
namespace {

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

long long meminfo_value(const std::string& key) {  // kB for sizes, a count for HugePages_*
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.compare(0, key.size() + 1, key + ":") == 0) return std::stoll(line.substr(key.size() + 1));
  }
  return -1;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      return p == std::string::npos ? "" : line.substr(p + 2);
    }
  }
  return "unknown";
}

nlohmann::json row(const std::string& node, const std::string& item, nlohmann::json value, const std::string& expected,
                   bool pass, const std::string& note = "") {
  return {{"check", "node"}, {"node", node}, {"item", item}, {"value", std::move(value)},
          {"expected", expected}, {"result", pass ? "PASS" : "FAIL"}, {"note", note}};
}

}  // namespace

std::vector<IbPort> read_ib_ports(const std::string& root) {
  std::vector<IbPort> out;
  for (const auto& dev : list_dir(root)) {
    for (const auto& port : list_dir(root + "/" + dev + "/ports")) {
      IbPort p;
      p.device = dev;
      p.port = std::atoi(port.c_str());
      std::string base = root + "/" + dev + "/ports/" + port;
      std::string st = read_line(base + "/state");  // "4: ACTIVE"
      auto c = st.find(':');
      p.state = c == std::string::npos ? st : st.substr(c + 2);
      p.rate_gbps = std::atof(read_line(base + "/rate").c_str());  // "200 Gb/sec (4X HDR)"
      p.link_layer = read_line(base + "/link_layer");
      out.push_back(p);
    }
  }
  return out;
}

nlohmann::json run_node_checks(const Profile& p, const std::string& node) {
  nlohmann::json rows = nlohmann::json::array();

  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  rows.push_back(row(node, "cpu_cores", cores, ">= " + std::to_string(p.cpu_min_cores), cores >= p.cpu_min_cores));
  std::string model = cpu_model();
  bool model_ok = p.cpu_model_regex.empty() || std::regex_search(model, std::regex(p.cpu_model_regex));
  rows.push_back(row(node, "cpu_model", model, p.cpu_model_regex.empty() ? "any" : "/" + p.cpu_model_regex + "/", model_ok));

  long long mem_kb = meminfo_value("MemTotal");
  double mem = static_cast<double>(mem_kb) * 1024;
  rows.push_back(row(node, "memory", format_bytes(mem), ">= " + format_bytes(static_cast<double>(p.memory_min_bytes)),
                     mem_kb >= 0 && mem >= static_cast<double>(p.memory_min_bytes)));

  long long huge = meminfo_value("HugePages_Total");
  rows.push_back(row(node, "hugepages", huge, ">= " + std::to_string(p.hugepages_min), huge >= p.hugepages_min));

  // IB/RoCE ports in sysfs: exactly ib_ports ports must be present, in the expected state and at
  // least the expected rate (NHC's check_hw_ib); extra ports are reported too (a wrong SKU).
  auto ports = read_ib_ports();
  int good = 0;
  std::string bad_ports;
  for (const auto& port : ports) {
    bool ok = port.state == p.ib_state && port.rate_gbps >= p.ib_min_rate_gbps &&
              (p.ib_link_layer.empty() || port.link_layer == p.ib_link_layer);
    good += ok;
    if (!ok) {
      std::ostringstream s;
      s << port.device << ":" << port.port << " " << port.state << " " << port.rate_gbps << " Gb/s " << port.link_layer;
      bad_ports += (bad_ports.empty() ? "" : "; ") + s.str();
    }
  }
  std::string expect = std::to_string(p.ib_ports) + " x " + p.ib_state;
  if (p.ib_min_rate_gbps > 0) expect += " >= " + std::to_string(static_cast<int>(p.ib_min_rate_gbps)) + " Gb/s";
  if (!p.ib_link_layer.empty()) expect += " " + p.ib_link_layer;
  std::string note = ports.empty() ? "no /sys/class/infiniband ports" : bad_ports.empty() ? "" : "off: " + bad_ports;
  rows.push_back(row(node, "ib_ports", good, expect, good == p.ib_ports && static_cast<long long>(ports.size()) == p.ib_ports, note));

  // The same ports as UCX sees them (its "ib" component: one device per port, e.g. mlx5_0:1).
  if (comm::ucx_available()) {
    std::set<std::string> ib_devs, net_devs;
    try {
      for (const auto& d : comm::ucx_devices()) {
        if (d.type == "net") net_devs.insert(d.device);
        if (d.component == "ib") ib_devs.insert(d.device);
      }
      std::string seen;
      for (const auto& d : net_devs) seen += (seen.empty() ? "net: " : ",") + d;
      long long n = static_cast<long long>(ib_devs.size());
      rows.push_back(row(node, "ucx_ib_devices", n, "== " + std::to_string(p.ib_ports), n == p.ib_ports, seen));
    } catch (const std::exception& e) {
      rows.push_back(row(node, "ucx_ib_devices", nullptr, "== " + std::to_string(p.ib_ports), false, e.what()));
    }
  } else {
    auto r = row(node, "ucx_ib_devices", nullptr, "== " + std::to_string(p.ib_ports), false, "built without UCX");
    r["result"] = "SKIP";
    rows.push_back(r);
  }

  // GPUs: the NVIDIA driver lists each one under /proc/driver/nvidia/gpus, no CUDA needed to count.
  long long gpus = static_cast<long long>(list_dir("/proc/driver/nvidia/gpus").size());
  rows.push_back(row(node, "gpu_count", gpus, "== " + std::to_string(p.gpu_count), gpus == p.gpu_count));
  if (p.gpu_min_memory > 0) {
    // Each GPU's memory from the CUDA runtime (a CUDA build); the limit is per GPU.
    const std::string limit = ">= " + format_bytes(static_cast<double>(p.gpu_min_memory));
    std::string why;
    auto list = comm::list_gpus(&why);
    if (!comm::gpu_support_built()) {
      auto r = row(node, "gpu_memory", nullptr, limit, false, "not measured: " + why);
      r["result"] = "SKIP";
      rows.push_back(r);
    } else if (list.empty()) {
      rows.push_back(row(node, "gpu_memory", nullptr, limit, false, why));
    } else {
      for (const auto& g : list)
        rows.push_back(row(node, "gpu" + std::to_string(g.index) + "_memory", format_bytes(static_cast<double>(g.total_bytes)),
                           limit, g.total_bytes >= p.gpu_min_memory,
                           g.name + " " + g.pci_bus_id + ", " + format_bytes(static_cast<double>(g.free_bytes)) + " free"));
    }
  }

  struct statvfs vfs{};
  if (statvfs(p.disk_path.c_str(), &vfs) == 0) {
    double free_b = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
    rows.push_back(row(node, "disk_free", format_bytes(free_b), ">= " + format_bytes(static_cast<double>(p.disk_min_free)),
                       free_b >= static_cast<double>(p.disk_min_free), p.disk_path));
  } else {
    rows.push_back(row(node, "disk_free", nullptr, ">= " + format_bytes(static_cast<double>(p.disk_min_free)), false,
                       p.disk_path + ": " + std::strerror(errno)));
  }
  return rows;
}

}  // namespace hpct::healthcheck

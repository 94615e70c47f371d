#include "common/models/cpu_threads.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

namespace specwire {
namespace {

std::vector<int> Allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

// Cpus_allowed_list of every thread of this process, by thread id.
std::map<std::string, std::string> ThreadAffinities() {
  std::map<std::string, std::string> out;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream status(t.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) {
        out[t.path().filename()] = line.substr(line.find_first_not_of(" \t", 18));
      }
    }
  }
  return out;
}

TEST(CpuBinding, ParsesNoneCoresAndLists) {
  const std::vector<int> allowed = Allowed();
  ASSERT_FALSE(allowed.empty());
  EXPECT_TRUE(ParseCpuBinding("none", 2)->cpus.empty());
  EXPECT_EQ(ParseCpuBinding("none", 2)->ToString(), "none");
  // cores: one CPU per thread, as many as the process may use.
  auto cores = ParseCpuBinding("cores", 1);
  ASSERT_TRUE(cores.ok()) << cores.status();
  EXPECT_EQ(cores->cpus, std::vector<int>{allowed[0]});
  auto all = ParseCpuBinding("cores", 1000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->cpus, allowed);
  const std::string first = std::to_string(allowed.front());
  auto one = ParseCpuBinding(first + "-" + first, 4);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->cpus, std::vector<int>{allowed.front()});
  EXPECT_EQ(ParseCpuBinding(first, 4)->ToString(), first);
  // auto: bound when the threads take every allowed CPU, not otherwise.
  const int n = static_cast<int>(allowed.size());
  EXPECT_EQ(ParseCpuBinding("auto", n)->cpus, allowed);
  EXPECT_TRUE(ParseCpuBinding("auto", n + 1)->cpus.empty());
  if (n > 1) {
    EXPECT_TRUE(ParseCpuBinding("auto", 1)->cpus.empty());
  }
}

TEST(CpuBinding, RefusesWhatCannotBeBoundByName) {
  const std::vector<int> allowed = Allowed();
  const int outside = allowed.back() + 1;
  for (const std::string& bad :
       {std::string("fast"), std::string("3-1"), std::string("-1"), std::string("1,,2"),
        std::to_string(outside), std::string("0-") + std::to_string(outside),
        std::string("0-99999999")}) {
    auto b = ParseCpuBinding(bad, 2, "--cpu_binding");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find("--cpu_binding=" + bad), std::string::npos)
        << b.status();
    EXPECT_NE(b.status().message().find("none | cores"), std::string::npos) << b.status();
  }
}

// The calling thread and every member of its intra-op team end up on the binding's CPUs, one
// each, and stay there across forwards; another thread binds its own team.
TEST(CpuBinding, PinsTheCallingThreadAndItsTeam) {
  const std::vector<int> allowed = Allowed();
  const int threads = static_cast<int>(std::min<size_t>(allowed.size(), 2));
  const int before = at::get_num_threads();
  at::set_num_threads(threads);
  auto cores = ParseCpuBinding("cores", threads);
  ASSERT_TRUE(cores.ok());
  SetCpuBinding(*cores);
  std::thread worker([&] {
    BindIntraOpThreads();
    // A real intra-op region (libtorch's own code) after the binding.
    at::Tensor a = at::rand({256, 256});
    (void)at::matmul(a, a).sum().item<float>();
    BindIntraOpThreads();  // idempotent
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof(set), &set);
    EXPECT_EQ(CPU_COUNT(&set), 1);
    EXPECT_TRUE(CPU_ISSET(cores->cpus[0], &set));
    std::map<std::string, int> pinned;  // single-CPU affinity lists seen
    for (const auto& [tid, list] : ThreadAffinities()) {
      if (list.find_first_of(",-") == std::string::npos) ++pinned[list];
    }
    for (int i = 0; i < threads; ++i) {
      EXPECT_GE(pinned[std::to_string(cores->cpus[i])], 1) << "CPU " << cores->cpus[i];
    }
  });
  worker.join();
  SetCpuBinding(CpuBinding{});
  at::set_num_threads(before);
}

}  // namespace
}  // namespace specwire

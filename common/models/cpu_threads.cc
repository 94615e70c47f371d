#include "common/models/cpu_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace specwire {
namespace {

std::mutex g_mu;
CpuBinding g_binding;                 // under g_mu
std::atomic<uint64_t> g_generation{0};  // bumped by every SetCpuBinding

std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

std::string Ranges(const std::vector<int>& cpus) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

void PinCallingThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// torch's OpenMP runtime, found where the process loaded it (the one libtorch depends on: a
// runtime of our own would have its own threads). GOMP_parallel is the entry point a compiler
// emits for `#pragma omp parallel` (Intel's runtime exports it too); each calling thread's team
// is the pool its intra-op regions reuse, member i being the same thread every time.
struct OpenMpRuntime {
  void (*parallel)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) = nullptr;
  int (*thread_num)() = nullptr;
  bool ok() const { return parallel != nullptr && thread_num != nullptr; }
};

const OpenMpRuntime& OpenMp() {
  static const OpenMpRuntime rt = [] {
    OpenMpRuntime r;
    r.parallel = reinterpret_cast<decltype(r.parallel)>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
    r.thread_num = reinterpret_cast<decltype(r.thread_num)>(dlsym(RTLD_DEFAULT,
                                                                 "omp_get_thread_num"));
    return r;
  }();
  return rt;
}

struct PinPlan {
  const std::vector<int>* cpus;
};

void PinTeamMember(void* data) {
  const auto* plan = static_cast<const PinPlan*>(data);
  const int tid = OpenMp().thread_num();
  PinCallingThread((*plan->cpus)[static_cast<size_t>(tid) % plan->cpus->size()]);
}

// One IntraOpForEach: the next index to hand out, and the first error.
struct IndexLoop {
  IndexLoop(int64_t n, absl::FunctionRef<void(int64_t)> fn) : n(n), fn(fn) {}
  const int64_t n;
  const absl::FunctionRef<void(int64_t)> fn;
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::exception_ptr error;  // under mu
};

void RunIndexLoop(void* data) {
  auto* loop = static_cast<IndexLoop*>(data);
  try {
    for (int64_t i = loop->next.fetch_add(1); i < loop->n; i = loop->next.fetch_add(1)) {
      loop->fn(i);
    }
  } catch (...) {
    loop->next.store(loop->n);  // the other threads stop at their next index
    std::lock_guard<std::mutex> lock(loop->mu);
    if (!loop->error) loop->error = std::current_exception();
  }
}

}  // namespace

void IntraOpForEach(int64_t n, absl::FunctionRef<void(int64_t)> fn) {
  if (n <= 0) return;
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  if (threads <= 1 || !OpenMp().ok() || at::in_parallel_region()) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  IndexLoop loop(n, fn);
  OpenMp().parallel(&RunIndexLoop, &loop, static_cast<unsigned>(threads), 0);
  if (loop.error) std::rethrow_exception(loop.error);
}

std::string CpuBinding::ToString() const {
  return cpus.empty() ? "none" : absl::StrJoin(cpus, ",");
}

absl::StatusOr<CpuBinding> ParseCpuBinding(absl::string_view value, int threads,
                                           absl::string_view flag) {
  CpuBinding b;
  if (value == "none") return b;
  if (!OpenMp().ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        flag, "=", value, ": this build's torch has no OpenMP runtime to bind (use none)"));
  }
  const std::vector<int> allowed = AllowedCpus();
  if (allowed.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, "=", value, ": cannot read the CPUs this process may run on"));
  }
  const int n = threads > 0 ? threads : at::get_num_threads();
  if (value == "auto") {
    // Bound only when the intra-op threads take every CPU the process may use: then no other
    // instance is meant to share them. With fewer threads the process does not know which of
    // its CPUs are its own (several extractors on one host, test servers side by side).
    if (n != static_cast<int>(allowed.size())) return b;
    value = "cores";
  }
  if (value == "cores") {
    for (int i = 0; i < std::min<int>(n, static_cast<int>(allowed.size())); ++i) {
      b.cpus.push_back(allowed[i]);
    }
    return b;
  }
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, "=", value, ": ", why,
        " (auto | none | cores | CPU ids and ranges such as 0-3,8 among ",
        Ranges(allowed), ", the CPUs this process may run on)"));
  };
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(ends[0], &lo) ||
        !absl::SimpleAtoi(ends.size() == 2 ? ends[1] : ends[0], &hi) || lo < 0 || hi < lo) {
      return refuse(absl::StrCat("'", part, "' is not a CPU id or a range lo-hi"));
    }
    if (hi - lo > CPU_SETSIZE) return refuse(absl::StrCat("'", part, "' is too wide"));
    for (int c = lo; c <= hi; ++c) {
      if (std::find(allowed.begin(), allowed.end(), c) == allowed.end()) {
        return refuse(absl::StrCat("CPU ", c, " is not one this process may run on"));
      }
      b.cpus.push_back(c);
    }
  }
  return b;
}

void SetCpuBinding(CpuBinding binding) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_binding = std::move(binding);
  g_generation.fetch_add(1);
}

void BindIntraOpThreads() {
  thread_local uint64_t bound = 0;  // the generation this thread's team was bound for
  const uint64_t generation = g_generation.load();
  if (bound == generation) return;
  bound = generation;
  std::vector<int> cpus;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    cpus = g_binding.cpus;
  }
  if (cpus.empty()) return;
  // A region of the intra-op team's size: member i (0: the calling thread) pins itself.
  PinPlan plan{&cpus};
  OpenMp().parallel(&PinTeamMember, &plan, static_cast<unsigned>(at::get_num_threads()), 0);
}

}  // namespace specwire

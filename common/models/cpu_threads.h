// Where the CPU's intra-op threads run. Unbound, the kernel moves them between cores as load
// comes and goes (and a forward waits for its slowest thread at every parallel region); bound,
// intra-op thread i stays on the i-th CPU of the set, as vLLM's CPU backend binds its OpenMP
// threads. The measured trade-off is in bench/extract_vs_vllm.py and the README.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specwire {

struct CpuBinding {
  // Empty: threads are not bound. Otherwise intra-op thread i runs on cpus[i % cpus.size()].
  std::vector<int> cpus;
  std::string ToString() const;  // "none" or "0,1,2"
};

// From a flag's value: "none"; "cores" (the CPUs this process may run on, in order, one per
// intra-op thread); "auto" (cores when the intra-op threads are as many as those CPUs, none
// otherwise); or a list of CPU ids and ranges ("0-3,8"), each one this process may run on.
// `threads` is the intra-op thread count (0: torch's). INVALID_ARGUMENT naming `flag`, the value
// and what is allowed.
absl::StatusOr<CpuBinding> ParseCpuBinding(absl::string_view value, int threads,
                                           absl::string_view flag = "--cpu_binding");

// Sets the process-wide binding; BindIntraOpThreads applies it.
void SetCpuBinding(CpuBinding binding);

// Binds the calling thread and the intra-op threads of its parallel regions (each thread that
// runs forwards has its own team) to the binding's CPUs. Idempotent per calling thread, cheap
// after the first call: call it at the start of every forward entry point. A no-op when unbound.
void BindIntraOpThreads();

// Runs fn(i) for every i in [0, n) on the calling thread's intra-op team (torch's OpenMP
// threads), each thread taking the next index as it becomes free: items of uneven cost, and
// threads that share their core with another process, still finish together. Our own kernels use
// this instead of at::parallel_for, whose parallel path is inline and exists only in translation
// units compiled with -fopenmp (and a runtime of our own would be a second thread pool). Runs
// serially with one intra-op thread, inside a parallel region, or without an OpenMP runtime. The
// first exception an item throws is rethrown here once every thread has stopped.
void IntraOpForEach(int64_t n, absl::FunctionRef<void(int64_t)> fn);

}  // namespace specwire

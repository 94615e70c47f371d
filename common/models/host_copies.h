// Device-to-host copies of captured hidden states that overlap the next forward.
//
// On a GPU, `state.to(kCPU)` is a synchronous copy into pageable memory: the host waits for the
// forward that made the state, then for the copy, and only then queues the next forward, so the
// GPU idles through every copy. HostCopies instead converts the state to the requested dtype on
// the device (on the compute stream), then copies it into pinned host memory on a stream of its
// own that waits for exactly that point of the compute stream; the host goes on to queue the next
// forward at once, and the copy engine moves the bytes while the GPU computes. Finish() waits for
// every queued copy. The device tensors a copy reads are held until then, so the caching
// allocator cannot hand their memory to the next forward while the copy still reads it.
//
// On the CPU (or without CUDA), and for states on another device than the one given (a
// layer-split device map), Queue is the plain `.to(kCPU, dtype).contiguous()`.
//
// One instance per Extract call; not thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

namespace specwire {

class HostCopies {
 public:
  explicit HostCopies(const at::Device& device);
  ~HostCopies();  // waits for the queued copies
  HostCopies(const HostCopies&) = delete;
  HostCopies& operator=(const HostCopies&) = delete;

  // A host tensor that holds `state` in `dtype` once Finish() has returned (contiguous).
  at::Tensor Queue(const at::Tensor& state, at::ScalarType dtype);
  // Waits for every queued copy (the host tensors are complete after it).
  void Finish();
  // Whether copies run asynchronously here (a CUDA device in a CUDA build).
  bool asynchronous() const { return stream_ != nullptr; }

 private:
  struct Stream;
  std::unique_ptr<Stream> stream_;  // null: synchronous copies
  std::vector<at::Tensor> held_;    // device tensors read by queued copies
};

}  // namespace specwire

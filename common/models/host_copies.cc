#include "common/models/host_copies.h"

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace specwire {

// The copy stream of one device, and the compute stream it follows. Device-generic c10 types:
// no CUDA header is needed, and the CUDA implementation is the one libtorch_cuda registers.
struct HostCopies::Stream {
  explicit Stream(const at::Device& device)
      : impl(device.type()),
        compute(impl.getStream(device)),
        copy(impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false)) {}
  c10::impl::VirtualGuardImpl impl;
  c10::Stream compute;
  c10::Stream copy;
};

HostCopies::HostCopies(const at::Device& device) {
#ifdef SPECWIRE_WITH_CUDA
  if (device.is_cuda()) stream_ = std::make_unique<Stream>(device);
#else
  (void)device;
#endif
}

HostCopies::~HostCopies() {
  try {
    Finish();
  } catch (...) {  // a failed device: the caller has its error already
  }
}

at::Tensor HostCopies::Queue(const at::Tensor& state, at::ScalarType dtype) {
  // States of other devices (a layer-split device map) are copied synchronously.
  if (!stream_ || state.device() != stream_->compute.device()) {
    return state.to(at::kCPU, dtype).contiguous();
  }
  // The dtype conversion runs on the compute stream, where `state` is made.
  at::Tensor source = state.to(dtype).contiguous();
  at::Tensor host = at::empty(source.sizes(), at::TensorOptions().dtype(dtype).pinned_memory(true));
  c10::Event ready(stream_->compute.device_type());
  ready.record(stream_->compute);
  ready.block(stream_->copy);  // the copy waits for the forward up to here, the host does not
  {
    c10::StreamGuard on_copy_stream(stream_->copy);
    host.copy_(source, /*non_blocking=*/true);
  }
  held_.push_back(std::move(source));
  return host;
}

void HostCopies::Finish() {
  if (!stream_ || held_.empty()) return;
  c10::Event done(stream_->copy.device_type());
  done.record(stream_->copy);
  done.synchronize();
  held_.clear();
}

}  // namespace specwire

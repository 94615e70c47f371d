// The process-wide memory policy the binaries that run forwards or read hidden-state streams
// apply at start-up (specwire-extractor, specwire-extract, specwire-scorer, specwire-replay,
// specwire-cli, the C++ benchmarks).
#pragma once

namespace specwire {

// Tunes glibc's allocator for a process that allocates the same large sizes over and over (a
// forward pass's activations, gRPC's receive buffers of a hidden-state stream): freed memory is
// kept for reuse (up to 32 MiB blocks from the heap instead of fresh mmaps, no trimming of the
// heap top) instead of being handed back to the kernel and faulted in again page by page, which
// on loopback costs more than the bytes' copies (bench/stream_vs_tcp.cc). Peak RSS is unchanged
// (it is the peak of the work either way); the resident set just does not shrink between
// requests. A MALLOC_*_ environment variable the user set for one of these settings wins. Call
// once at start-up, before the first allocation of that kind.
void KeepFreedMemoryForReuse();

}  // namespace specwire

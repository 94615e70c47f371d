#include "clients/cpp/health_check.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/enum_names.h"
#include "common/rpc/payload_frame.h"

namespace specwire {
namespace {

// grpc.health.v1 has no C++ stubs in Debian's gRPC packages, and its two messages are one field
// each, so they are encoded by hand: HealthCheckRequest { string service = 1; },
// HealthCheckResponse { ServingStatus status = 1; }.
std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;  // proto3 leaves default values out
  out.push_back(0x0a);              // field 1, length-delimited
  AppendVarint(service.size(), &out);
  return out + service;
}

bool ReadVarint(const std::string& in, size_t& pos, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64 && pos < in.size(); shift += 7) {
    const auto b = static_cast<uint8_t>(in[pos++]);
    value |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// The status field of a HealthCheckResponse; unknown fields are skipped as proto3 requires.
absl::StatusOr<ServingStatus> DecodeResponse(const std::string& in) {
  uint64_t status = 0;
  size_t pos = 0;
  while (pos < in.size()) {
    uint64_t tag, v;
    if (!ReadVarint(in, pos, tag)) break;
    const uint64_t wire = tag & 7;
    if (wire == 0) {
      if (!ReadVarint(in, pos, v)) break;
      if (tag >> 3 == 1) status = v;
    } else if (wire == 2) {
      if (!ReadVarint(in, pos, v) || v > in.size() - pos) break;
      pos += v;
    } else if (wire == 1 || wire == 5) {
      pos += wire == 1 ? 8 : 4;
    } else {
      break;
    }
  }
  if (pos != in.size()) return absl::InternalError("malformed grpc.health.v1.HealthCheckResponse");
  return static_cast<ServingStatus>(status > 3 ? 0 : status);
}

}  // namespace

const char* ServingStatusName(ServingStatus s) {
  constexpr EnumName<ServingStatus> kNames[] = {
      {ServingStatus::kServing, "SERVING"},
      {ServingStatus::kNotServing, "NOT_SERVING"},
      {ServingStatus::kServiceUnknown, "SERVICE_UNKNOWN"}};
  return NameOf(kNames, s, "UNKNOWN");
}

absl::StatusOr<ServingStatus> CheckHealth(const std::string& target, const std::string& service,
                                          double timeout_seconds, const ClientSecurity& security) {
  auto channel = MakeChannel(target, security, grpc::ChannelArguments());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  if (timeout_seconds > 0) {
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::duration_cast<std::chrono::system_clock::duration>(
                         std::chrono::duration<double>(timeout_seconds)));
  }
  const std::string request = EncodeRequest(service);
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request_buffer, &cq);
  call->StartCall();
  grpc::ByteBuffer response_buffer;
  grpc::Status status;
  call->Finish(&response_buffer, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || !ok) return absl::InternalError("health check: call did not finish");
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("health check of \"", service, "\" on ", target, ": ",
                                     status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  if (!response_buffer.Dump(&slices).ok()) {
    return absl::InternalError("health check: unreadable response");
  }
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return DecodeResponse(bytes);
}

}  // namespace specwire

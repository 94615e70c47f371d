// The one place where absl::Status becomes a grpc::Status (codes map one to one; the message is
// kept, and names the offending field wherever the error came from user input).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace specwire {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);
// "OK", "INVALID_ARGUMENT", ... (metric labels)
const char* GrpcCodeName(grpc::StatusCode code);

}  // namespace specwire

// grpc.reflection.v1.ServerReflection, served by specwire itself (the gRPC release the servers
// build against serves only grpc.reflection.v1alpha, through its plugin, which stays on too).
// Schemas come from the process's generated descriptor pool: every service compiled into the
// binary (specwire.v1.*, grpc.health.v1, both reflection versions) resolves, with the files it
// depends on. Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "proto/grpc/reflection/v1/reflection.grpc.pb.h"

namespace specwire {

class ReflectionV1Service final : public grpc::reflection::v1::ServerReflection::CallbackService {
 public:
  // `services`: the fully qualified names list_services answers with.
  explicit ReflectionV1Service(std::vector<std::string> services);

  grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest,
                          grpc::reflection::v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* ctx) override;

 private:
  class Stream;
  const std::vector<std::string> services_;
};

}  // namespace specwire

#include "common/rpc/reflection_service.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <set>
#include <utility>

namespace specwire {
namespace {

namespace pb = google::protobuf;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

void SetError(ServerReflectionResponse* r, grpc::StatusCode code, const std::string& message) {
  r->mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  r->mutable_error_response()->set_error_message(message);
}

}  // namespace

// One reflection stream: each request read is answered by one response, then the next is read.
class ReflectionV1Service::Stream final
    : public grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse> {
 public:
  explicit Stream(const std::vector<std::string>* services) : services_(services) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side (or the call ended)
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    Answer();
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "reflection stream closed"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  void Answer() {
    const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
    response_.set_valid_host(request_.host());
    *response_.mutable_original_request() = request_;
    switch (request_.message_request_case()) {
      case ServerReflectionRequest::kListServices:
        for (const std::string& name : *services_) {
          response_.mutable_list_services_response()->add_service()->set_name(name);
        }
        return;
      case ServerReflectionRequest::kFileByFilename: {
        const pb::FileDescriptor* f = pool->FindFileByName(request_.file_by_filename());
        if (f == nullptr) {
          return SetError(&response_, grpc::StatusCode::NOT_FOUND,
                          "file not found: " + request_.file_by_filename());
        }
        return SendFile(f);
      }
      case ServerReflectionRequest::kFileContainingSymbol: {
        const pb::FileDescriptor* f =
            pool->FindFileContainingSymbol(request_.file_containing_symbol());
        if (f == nullptr) {
          return SetError(&response_, grpc::StatusCode::NOT_FOUND,
                          "symbol not found: " + request_.file_containing_symbol());
        }
        return SendFile(f);
      }
      case ServerReflectionRequest::kFileContainingExtension: {
        const auto& e = request_.file_containing_extension();
        const pb::Descriptor* type = pool->FindMessageTypeByName(e.containing_type());
        const pb::FieldDescriptor* ext =
            type == nullptr ? nullptr : pool->FindExtensionByNumber(type, e.extension_number());
        if (ext == nullptr) {
          return SetError(&response_, grpc::StatusCode::NOT_FOUND,
                          "extension not found: " + e.containing_type() + " " +
                              std::to_string(e.extension_number()));
        }
        return SendFile(ext->file());
      }
      case ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const pb::Descriptor* type =
            pool->FindMessageTypeByName(request_.all_extension_numbers_of_type());
        if (type == nullptr) {
          return SetError(&response_, grpc::StatusCode::NOT_FOUND,
                          "type not found: " + request_.all_extension_numbers_of_type());
        }
        std::vector<const pb::FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* r = response_.mutable_all_extension_numbers_response();
        r->set_base_type_name(type->full_name());
        for (const pb::FieldDescriptor* x : extensions) r->add_extension_number(x->number());
        return;
      }
      case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        return SetError(&response_, grpc::StatusCode::INVALID_ARGUMENT,
                        "message_request: none of its fields is set");
    }
  }

  // The file, then every file it depends on, directly or not (depth first, each once), as
  // gRPC's own reflection answers.
  void SendFile(const pb::FileDescriptor* file) {
    auto* out = response_.mutable_file_descriptor_response();
    std::set<std::string> sent;
    std::vector<const pb::FileDescriptor*> pending = {file};
    while (!pending.empty()) {
      const pb::FileDescriptor* f = pending.back();
      pending.pop_back();
      if (!sent.insert(f->name()).second) continue;
      pb::FileDescriptorProto proto;
      f->CopyTo(&proto);
      out->add_file_descriptor_proto(proto.SerializeAsString());
      for (int i = f->dependency_count() - 1; i >= 0; --i) pending.push_back(f->dependency(i));
    }
  }

  const std::vector<std::string>* services_;
  ServerReflectionRequest request_;
  ServerReflectionResponse response_;
};

ReflectionV1Service::ReflectionV1Service(std::vector<std::string> services)
    : services_(std::move(services)) {}

grpc::ServerBidiReactor<ServerReflectionRequest, ServerReflectionResponse>*
ReflectionV1Service::ServerReflectionInfo(grpc::CallbackServerContext* /*ctx*/) {
  return new Stream(&services_);
}

}  // namespace specwire

#include "common/rpc/security.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>

namespace specwire {
namespace {

namespace fs = std::filesystem;

fs::path Write(const std::string& name, const std::string& text) {
  const fs::path p = fs::path(::testing::TempDir()) / name;
  std::ofstream(p) << text;
  return p;
}

TEST(ConstantTimeEquals, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secre"));
  EXPECT_FALSE(ConstantTimeEquals("secret", ""));
  EXPECT_FALSE(ConstantTimeEquals("abc", std::string("abc\0", 4)));
}

TEST(ReadTokenFile, StripsWhitespaceAndRefusesEmpty) {
  EXPECT_EQ(*ReadTokenFile(Write("tok", "  abc123\n").string()), "abc123");
  EXPECT_EQ(ReadTokenFile(Write("blank", " \n\t").string()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadTokenFile("/nonexistent/token").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MakeServerCredentials, FlagErrorsNameTheFlag) {
  ServerSecurityOptions o;
  o.tls_cert = "cert.pem";
  auto s = MakeServerCredentials(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--tls_cert and --tls_key"), std::string::npos);

  o = {};
  o.tls_client_ca = "ca.pem";
  s = MakeServerCredentials(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--tls_client_ca"), std::string::npos);

  o = {};
  o.tls_cert = "/nonexistent/cert.pem";
  o.tls_key = "/nonexistent/key.pem";
  s = MakeServerCredentials(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--tls_cert: cannot read"), std::string::npos);

  o = {};
  o.auth_token_file = "/nonexistent/token";
  s = MakeServerCredentials(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--auth_token_file"), std::string::npos);

  o = {};
  o.auth_token_file = Write("tok2", "t0ken").string();
  EXPECT_TRUE(MakeServerCredentials(o).ok());
  EXPECT_EQ(DescribeServerSecurity(o), "plaintext + bearer token (health open)");
}

TEST(LoadClientSecurity, NamesFlagsInTheCallersStyle) {
  unsetenv("SPECWIRE_AUTH_TOKEN");
  unsetenv("SPECWIRE_AUTH_TOKEN_FILE");
  ClientSecurityFiles f;
  f.ca_file = "/nonexistent/ca.pem";
  f.flag_prefix = "--extractor_";
  auto s = LoadClientSecurity(f);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--extractor_tls_ca: cannot read"), std::string::npos);

  f = {};
  f.cert_file = "c.pem";
  f.flag_prefix = "--scorer_";
  s = LoadClientSecurity(f);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--scorer_tls_client_cert and --scorer_tls_client_key"),
            std::string::npos);

  f = {};
  s = LoadClientSecurity(f);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->tls);
  EXPECT_TRUE(s->token.empty());

  setenv("SPECWIRE_AUTH_TOKEN", " from-env \n", 1);
  s = LoadClientSecurity(f);
  unsetenv("SPECWIRE_AUTH_TOKEN");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->token, "from-env");

  setenv("SPECWIRE_AUTH_TOKEN_FILE", Write("tok3", "from-file").c_str(), 1);
  s = LoadClientSecurity(f);
  unsetenv("SPECWIRE_AUTH_TOKEN_FILE");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->token, "from-file");

  f.ca_file = Write("ca.pem", "-----BEGIN CERTIFICATE-----\n").string();
  s = LoadClientSecurity(f);
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->tls);
}

// Answers every method with FAILED_PRECONDITION "handler reached" (proof that a call got past
// the token check).
class ReachedService : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      Reactor() { Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "handler reached")); }
      void OnDone() override { delete this; }
    };
    return new Reactor;
  }
};

// A plaintext listener with a token: the health service (no token needed by default) answers,
// a call to any other method without the token is refused before it reaches a handler.
TEST(MakeServerCredentials, PlaintextTokenCheckRunsBeforeHandlers) {
  ServerSecurityOptions o;
  o.auth_token_file = Write("tok4", "t0ken").string();
  auto creds = MakeServerCredentials(o);
  ASSERT_TRUE(creds.ok());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder b;
  ReachedService reached;
  b.RegisterCallbackGenericService(&reached);
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", *creds, &port);
  auto server = b.BuildAndStart();
  ASSERT_NE(port, 0);
  const std::string target = "127.0.0.1:" + std::to_string(port);

  auto call = [&](const std::string& token, const std::string& method) {
    ClientSecurity cs;
    cs.token = token;
    auto channel = MakeChannel(target, cs, grpc::ChannelArguments());
    grpc::GenericStub stub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::ByteBuffer request, response;
    grpc::Slice empty("");
    request = grpc::ByteBuffer(&empty, 1);
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      status = s;
      done = true;
      cv.notify_one();
    });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return status;
  };
  EXPECT_TRUE(call("", "/grpc.health.v1.Health/Check").ok());
  auto s = call("", "/no.Such/Method");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(s.error_message().find("missing bearer token"), std::string::npos);
  EXPECT_EQ(call("wrong", "/no.Such/Method").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("Bearer t0ken", "/no.Such/Method").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);  // "Bearer Bearer t0ken"
  // With the right token the call reaches the handler.
  s = call("t0ken", "/no.Such/Method");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "handler reached");
  server->Shutdown();
}

}  // namespace
}  // namespace specwire

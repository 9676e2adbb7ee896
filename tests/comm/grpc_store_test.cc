// GrpcStore against an in-test Cluster service that implements the Store*
// RPCs over an InMemoryStore (scoped by job id + generation, bearer token
// checked): basic operations, timeouts, auth failure, and a 2-rank Gloo
// rendezvous through it.
#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tandem/v1/cluster.grpc.pb.h"
#include "worker/comm/collective.h"
#include "worker/comm/grpc_store.h"

namespace tandem::comm {
namespace {

using std::chrono::milliseconds;

class StoreService final : public tandem::v1::Cluster::Service {
 public:
  grpc::Status StoreSet(grpc::ServerContext* ctx, const tandem::v1::StoreSetRequest* req,
                        tandem::v1::StoreSetResponse*) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    return To(store_.Set(Key(req->scope(), req->key()), req->value()));
  }
  grpc::Status StoreGet(grpc::ServerContext* ctx, const tandem::v1::StoreGetRequest* req,
                        tandem::v1::StoreGetResponse* resp) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    auto v = store_.Get(Key(req->scope(), req->key()), milliseconds(req->timeout_ms()));
    if (!v.ok()) return To(v.status());
    resp->set_value(*v);
    return grpc::Status::OK;
  }
  grpc::Status StoreAdd(grpc::ServerContext* ctx, const tandem::v1::StoreAddRequest* req,
                        tandem::v1::StoreAddResponse* resp) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    auto v = store_.Add(Key(req->scope(), req->key()), req->delta());
    if (!v.ok()) return To(v.status());
    resp->set_value(*v);
    return grpc::Status::OK;
  }
  grpc::Status StoreWait(grpc::ServerContext* ctx, const tandem::v1::StoreWaitRequest* req,
                         tandem::v1::StoreWaitResponse*) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    std::vector<std::string> keys;
    for (const auto& k : req->keys()) keys.push_back(Key(req->scope(), k));
    return To(store_.Wait(keys, milliseconds(req->timeout_ms())));
  }
  grpc::Status StoreDelete(grpc::ServerContext* ctx, const tandem::v1::StoreDeleteRequest* req,
                           tandem::v1::StoreDeleteResponse* resp) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    auto v = store_.Delete(Key(req->scope(), req->key()));
    if (!v.ok()) return To(v.status());
    resp->set_deleted(*v);
    return grpc::Status::OK;
  }

 private:
  static std::string Key(const tandem::v1::StoreScope& scope, const std::string& key) {
    return absl::StrCat(scope.job_id(), "/", scope.generation(), "/", key);
  }
  static grpc::Status To(const absl::Status& s) {
    if (s.ok()) return grpc::Status::OK;
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
  }
  static grpc::Status Auth(grpc::ServerContext* ctx) {
    auto it = ctx->client_metadata().find("authorization");
    if (it == ctx->client_metadata().end() || std::string(it->second.data(), it->second.size()) != "Bearer secret") {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "bad token");
    }
    return grpc::Status::OK;
  }
  InMemoryStore store_;
};

class GrpcStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
  }
  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<Store> Make(const std::string& token, int64_t gen = 1) {
    GrpcStoreOptions o;
    o.target = absl::StrCat("127.0.0.1:", port_);
    o.job_id = "job-a";
    o.generation = gen;
    o.token = token;
    auto s = MakeGrpcStore(o);
    EXPECT_TRUE(s.ok());
    return std::move(*s);
  }

  StoreService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(GrpcStoreTest, OperationsScopesAndTimeouts) {
  auto s = Make("secret");
  ASSERT_TRUE(s->Set("k", std::string("v\0w", 3)).ok());
  auto v = s->Get("k", milliseconds(1000));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("v\0w", 3));
  EXPECT_EQ(*s->Add("n", 5), 5);
  EXPECT_EQ(*s->Add("n", -2), 3);
  EXPECT_TRUE(s->Wait({"k", "n"}, milliseconds(1000)).ok());
  EXPECT_EQ(s->Get("missing", milliseconds(200)).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(*s->Delete("k"));
  // Another generation does not see generation 1's keys.
  auto other = Make("secret", 2);
  EXPECT_FALSE(other->Get("n", milliseconds(100)).ok());
}

TEST_F(GrpcStoreTest, WrongTokenIsRejected) {
  auto s = Make("nope");
  absl::Status st = s->Set("k", "v");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnauthenticated) << st;
}

TEST_F(GrpcStoreTest, GlooRendezvousThroughCoordinatorStore) {
  std::unique_ptr<Collective> c[2];
  std::thread t([&] {
    auto s = Make("secret");
    CollectiveOptions o;
    o.timeout = milliseconds(10000);
    auto made = MakeCollective("gloo", *s, 1, 2, o);
    ASSERT_TRUE(made.ok()) << made.status();
    c[1] = std::move(*made);
  });
  auto s = Make("secret");
  CollectiveOptions o;
  o.timeout = milliseconds(10000);
  auto made = MakeCollective("gloo", *s, 0, 2, o);
  t.join();
  ASSERT_TRUE(made.ok()) << made.status();
  c[0] = std::move(*made);
  ASSERT_TRUE(c[1]);
  std::vector<float> a(5, 1.f), b(5, 2.f);
  std::thread t2([&] { EXPECT_TRUE(c[1]->allreduce(b.data(), 5, ReduceOp::kSum, milliseconds(5000)).ok()); });
  EXPECT_TRUE(c[0]->allreduce(a.data(), 5, ReduceOp::kSum, milliseconds(5000)).ok());
  t2.join();
  EXPECT_EQ(a[4], 3.f);
  EXPECT_EQ(b[0], 3.f);
}

}  // namespace
}  // namespace tandem::comm

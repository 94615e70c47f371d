// A server-streaming gRPC call fed by other threads, shared by the extractor and the scorer.
//
// Messages come from a queue of producers: the reaction queues the first ones (the contract),
// worker threads queue results later. One write is in flight at a time; the stream finishes when
// the producers are exhausted after Complete(), or at once on Fail().
//
// With an `Encoder`, the call is a raw one (gRPC's WithRawCallbackMethod): each message is
// encoded by `Encoder::Encode(const Response&, Payload, grpc::ByteBuffer*)` together with the
// payload its producer left in payload_slot(), so large bytes go out without a copy
// (payload_frame.h). Without one, messages are written as they are.
//
// Lifetime: gRPC may run OnDone — which drops gRPC's reference — on another thread the moment
// Finish() is called, and a worker may still deliver results after the call has ended. So the
// reactor is reference-counted: one reference for gRPC (until OnDone), one per attached piece of
// work (until ReleaseWork()), and one for the duration of every method that can call Finish(),
// taken before the lock so the lock is released while the object is alive.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/payload_frame.h"
#include "common/rpc/stream_watchdog.h"

namespace specwire {

// The call's deadline on the steady clock (gRPC gives it on the system clock); max() for none.
inline std::chrono::steady_clock::time_point SteadyDeadline(
    const grpc::CallbackServerContext* ctx) {
  const auto deadline = ctx->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return std::chrono::steady_clock::time_point::max();
  }
  const auto left = deadline - std::chrono::system_clock::now();
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
}

template <class Response, class Encoder = void>
class StreamReactor
    : public grpc::ServerWriteReactor<
          std::conditional_t<std::is_void_v<Encoder>, Response, grpc::ByteBuffer>>,
      public IdleStream {
 public:
  static constexpr bool kRaw = !std::is_void_v<Encoder>;
  // Fills the next message and returns true, or returns false when it has nothing more.
  using Producer = std::function<bool(Response*)>;
  // Called once, outside the reactor's lock, when the client cancels, the deadline passes or the
  // client stops reading, with why: DEADLINE_EXCEEDED "deadline exceeded" when the deadline
  // passed, CANCELLED "request cancelled" otherwise (the status the work ends with).
  using CancelHook = std::function<void(const absl::Status& why)>;
  // Called from OnDone with the final status code name ("OK", "CANCELLED", ...) and duration.
  using DoneHook = std::function<void(const std::string& code, double seconds)>;
  // Called once when the final status is handed to gRPC (before the client can see it), or at
  // OnDone if that comes first. A resource the client may reuse for its next call (a stream
  // slot) is released here: OnDone can run after the client already has its status.
  using FinishHook = std::function<void()>;

  StreamReactor(std::chrono::steady_clock::time_point deadline, DoneHook on_done,
                FinishHook on_finish = nullptr)
      : deadline_(deadline),
        on_done_(std::move(on_done)),
        on_finish_(std::move(on_finish)),
        start_(std::chrono::steady_clock::now()) {}

  // Lets `watchdog` cancel the call through `ctx` when the client stops reading (a write pending
  // past the watchdog's idle limit). Call right after construction; both must outlive OnDone.
  void WatchIdle(StreamWatchdog* watchdog, grpc::CallbackServerContext* ctx) {
    if (watchdog == nullptr || !watchdog->enabled()) return;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      watchdog_ = watchdog;
      ctx_ = ctx;
    }
    watchdog->Register(this);
  }

  // IdleStream.
  void AddRef() override { refs_.fetch_add(1); }
  void DropRef() override { Release(); }
  void CancelIfWritePendingSince(std::chrono::steady_clock::time_point cutoff,
                                 const std::string& reason) override {
    Hold hold(this);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (!writing_ || finished_ || done_ || ctx_ == nullptr || write_started_ > cutoff) return;
    // A failure already waiting for this write to finish keeps its own status.
    if (status_.ok()) status_ = grpc::Status(grpc::CANCELLED, reason);
    // The pending write then fails (OnWriteDone(false) finishes the call with status_, frees the
    // slot and cancels the work); reactions that run inline re-enter the recursive lock.
    ctx_->TryCancel();
  }

  // Writes wait until Resume(): a first message can be queued before the work is submitted, so
  // it is always first, while a submission error still arrives as a plain status.
  void Pause() {
    Hold hold(this);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    paused_ = true;
  }
  void Resume() {
    Hold hold(this);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    paused_ = false;
    WriteNextLocked();
  }
  void Send(Producer p) {
    Hold hold(this);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (completed_) return;
    producers_.push_back(std::move(p));
    WriteNextLocked();
  }
  // Queues one ready message.
  void SendMessage(Response m) {
    Send([m = std::move(m), sent = false](Response* out) mutable {
      if (sent) return false;
      *out = std::move(m);
      return sent = true;
    });
  }
  void Complete() {
    Hold hold(this);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    completed_ = true;
    WriteNextLocked();
  }
  void Fail(const absl::Status& s) {
    Hold hold(this);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (finished_) return;
    producers_.clear();
    completed_ = true;
    paused_ = false;
    status_ = ToGrpcStatus(s);
    if (!writing_) FinishLocked();
  }
  // Work that will call back later: the reactor stays alive until ReleaseWork(). `on_cancel`
  // runs at once if the call was already cancelled.
  void AttachWork(CancelHook on_cancel) {
    refs_.fetch_add(1);
    bool run_now = false;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      on_cancel_ = std::move(on_cancel);
      run_now = cancelled_;
    }
    if (run_now) FireCancel();
  }
  void ReleaseWork() { Release(); }
  // Raw calls: where a producer leaves the payload of the message it fills (read, under the
  // reactor's lock, right after the producer returns). Valid while the reactor lives.
  Payload* payload_slot() { return &payload_; }

  void OnWriteDone(bool ok) override {
    Hold hold(this);
    bool stopped = false;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      writing_ = false;
      if (!ok) {
        // The client went away; stop producing.
        producers_.clear();
        completed_ = true;
        cancelled_ = true;
        if (status_.ok()) status_ = grpc::Status(grpc::CANCELLED, "client stopped reading");
        FinishLocked();
        stopped = true;
      } else {
        WriteNextLocked();
      }
    }
    if (stopped) FireCancel();
  }
  void OnCancel() override {
    Hold hold(this);
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      cancelled_ = true;
    }
    FireCancel();
  }
  void OnDone() override {
    StreamWatchdog* watchdog = nullptr;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      done_ = true;
      watchdog = watchdog_;
    }
    if (watchdog != nullptr) watchdog->Unregister(this);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    std::string code;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      const auto c = status_.error_code();
      if (cancelled_ && (c == grpc::OK || c == grpc::CANCELLED || c == grpc::DEADLINE_EXCEEDED)) {
        code = DeadlinePassed() ? "DEADLINE_EXCEEDED" : "CANCELLED";
      } else {
        code = GrpcCodeName(c);
      }
      RunFinishHookLocked();
    }
    if (on_done_) on_done_(code, seconds);
    Release();
  }

 private:
  class Hold {
   public:
    explicit Hold(StreamReactor* r) : r_(r) { r_->refs_.fetch_add(1); }
    ~Hold() { r_->Release(); }

   private:
    StreamReactor* r_;
  };
  void Release() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }
  // gRPC cancels a call whose deadline passed; tell that apart from a client cancel (the two
  // clocks are converted, hence the small slack).
  bool DeadlinePassed() const {
    return std::chrono::steady_clock::now() + std::chrono::milliseconds(50) >= deadline_;
  }
  void FireCancel() {
    CancelHook hook;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      hook = std::move(on_cancel_);
      on_cancel_ = nullptr;
    }
    if (hook) {
      hook(DeadlinePassed() ? absl::DeadlineExceededError("deadline exceeded")
                            : absl::CancelledError("request cancelled"));
    }
  }
  void WriteNextLocked() {
    if (writing_ || finished_ || paused_) return;
    while (!producers_.empty()) {
      msg_.Clear();
      payload_ = Payload{};
      if (producers_.front()(&msg_)) {
        writing_ = true;
        write_started_ = std::chrono::steady_clock::now();
        if constexpr (kRaw) {
          wire_.Clear();
          Encoder::Encode(msg_, std::move(payload_), &wire_);
          payload_ = Payload{};
          this->StartWrite(&wire_);
        } else {
          this->StartWrite(&msg_);
        }
        return;
      }
      producers_.pop_front();
    }
    if (completed_) FinishLocked();
  }
  void FinishLocked() {
    if (finished_) return;
    finished_ = true;
    RunFinishHookLocked();
    this->Finish(status_);
  }
  void RunFinishHookLocked() {
    FinishHook hook = std::move(on_finish_);
    on_finish_ = nullptr;
    if (hook) hook();
  }

  std::chrono::steady_clock::time_point deadline_;
  DoneHook on_done_;
  FinishHook on_finish_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<int> refs_{1};  // gRPC's, until OnDone
  std::recursive_mutex mu_;   // reactions may run inline from StartWrite
  std::deque<Producer> producers_;
  Response msg_;
  Payload payload_;        // raw calls: the payload of msg_
  grpc::ByteBuffer wire_;  // raw calls: msg_ encoded, while its write is in flight
  CancelHook on_cancel_;
  bool writing_ = false;
  bool paused_ = false;
  bool completed_ = false;
  bool finished_ = false;
  bool cancelled_ = false;
  bool done_ = false;  // OnDone ran: ctx_ is gone
  std::chrono::steady_clock::time_point write_started_;
  StreamWatchdog* watchdog_ = nullptr;
  grpc::CallbackServerContext* ctx_ = nullptr;
  grpc::Status status_;
};

}  // namespace specwire

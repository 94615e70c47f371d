#include "services/extractor/session_service.h"

#include <algorithm>
#include <cstring>
#include <deque>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/stream_reactor.h"
#include "common/status.h"
#include "common/wire.h"
#include "proto/convert.h"
#include "services/extractor/stream_convert.h"

namespace specwire {
namespace {

// The states' chunks, as the Extract streams cut them.
void AppendChunks(const std::vector<HostState>& states, int64_t chunk_bytes,
                  std::deque<v1::SessionResponse>& out) {
  for (const HostState& s : states) {
    const int64_t row_bytes = s.rows > 0 ? static_cast<int64_t>(s.bytes.size()) / s.rows : 0;
    for (const ChunkSpan& c : PlanChunks(s.bytes, s.rows, row_bytes, chunk_bytes)) {
      v1::HiddenStateChunk* chunk = out.emplace_back().mutable_chunk();
      HiddenStateChunkHeaderToProto(s, c, chunk);
      chunk->set_data(c.bytes.data(), c.bytes.size());
    }
  }
}

int64_t StateRows(const std::vector<HostState>& states) {
  return states.empty() ? 0 : states.front().rows;
}

}  // namespace

// One stream. Its mutable state is guarded by mu_; at most one of these is pending at a time: a
// read (waiting for the client), a call on the worker, or the writes of the call's answers.
class SessionService::Reactor final
    : public grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse> {
 public:
  Reactor(SessionService* service, grpc::CallbackServerContext* ctx)
      : service_(service), deadline_(SteadyDeadline(ctx)) {
    service_->Register(this);
    Touch();
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side, or the call is gone
      std::lock_guard<std::mutex> lock(mu_);
      FinishLocked(grpc::Status::OK);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    busy_ = true;
    absl::Status queued = Dispatch();
    if (!queued.ok()) FinishLocked(ToGrpcStatus(queued));
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "the client stopped reading"));
      return;
    }
    out_.pop_front();
    WriteNextLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (job_) job_->cancelled = true;  // a queued call is dropped; its completion finishes
    if (!busy_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }

  void OnDone() override {
    service_->Unregister(this);
    // A worker that finished the call may still hold mu_ (Finish runs under it, and OnDone can
    // follow on another thread at once): wait for it to let go before the reactor goes.
    { std::lock_guard<std::mutex> lock(mu_); }
    delete this;
  }

  // Called by the idle check (under the service's mu_, so the reactor is alive).
  void ExpireIfIdle(std::chrono::steady_clock::time_point now, double idle_seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || busy_) return;
    if (service_->draining_) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "the extractor is shutting down; the session is closed"));
      return;
    }
    if (idle_seconds <= 0) return;
    if (std::chrono::duration<double>(now - last_activity_).count() <= idle_seconds) return;
    FinishLocked(grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        absl::StrCat("session ", session_id_.empty() ? "(not opened)" : session_id_,
                     ": idle for more than ", idle_seconds,
                     " s without a request (--session_idle_seconds); the session is closed")));
  }

 private:
  void Touch() { last_activity_ = std::chrono::steady_clock::now(); }

  // The session and its slot are given back before the final status goes to gRPC (the contract:
  // a session is freed when its stream ends): a client that saw the end may open the next at
  // once. No worker call is running here (every caller holds the stream idle or just finished).
  void FinishLocked(grpc::Status status) {
    if (finished_) return;
    finished_ = true;
    session_.reset();
    if (holds_slot_) {
      holds_slot_ = false;
      service_->Release(reserved_bytes_);
    }
    Finish(std::move(status));
  }

  // After a call's answers are queued: writes them in order, then reads the next request.
  void WriteNextLocked() {
    if (finished_) return;
    if (!out_.empty()) {
      StartWrite(&out_.front());
      return;
    }
    busy_ = false;
    Touch();
    if (service_->draining_) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "the extractor is shutting down; the session is closed"));
      return;
    }
    if (cancelled_) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    StartRead(&request_);
  }

  // Refused calls of a session that goes on: an answer, not the stream's end.
  void RefuseLocked(const absl::Status& s) {
    v1::SessionRefused* r = out_.emplace_back().mutable_refused();
    r->set_code(static_cast<int32_t>(s.code()));
    r->set_message(std::string(s.message()));
  }

  absl::Status Dispatch() {
    switch (request_.message_case()) {
      case v1::SessionRequest::kOpen: {
        if (session_) {
          RefuseLocked(absl::FailedPreconditionError(
              "open: this stream already holds a session (one session per stream)"));
          WriteNextLocked();
          return absl::OkStatus();
        }
        if (service_->draining_) return absl::UnavailableError("extractor is shutting down");
        SW_ASSIGN_OR_RETURN(SessionWork work, service_->validate_open_(request_.open()));
        const SessionLimits& limits = service_->limits_;
        if (work.max_draft_tokens > limits.max_draft_tokens) {
          return absl::InvalidArgumentError(
              absl::StrCat("open.max_draft_tokens: ", work.max_draft_tokens,
                           " exceeds the limit of ", limits.max_draft_tokens));
        }
        const int64_t capacity = static_cast<int64_t>(work.prompt.size()) + work.max_new_tokens +
                                 work.max_draft_tokens + 1;
        if (capacity > limits.max_session_tokens) {
          return absl::InvalidArgumentError(absl::StrCat(
              "open.max_new_tokens: prompt (", work.prompt.size(), ") + max_new_tokens (",
              work.max_new_tokens, ") + max_draft_tokens (", work.max_draft_tokens,
              ") + 1 = ", capacity, " positions exceed the limit of ", limits.max_session_tokens,
              " (--max_session_tokens)"));
        }
        const int64_t bytes = service_->backend_->SequenceBytes(capacity);
        SW_RETURN_IF_ERROR(service_->Acquire(bytes));
        holds_slot_ = true;
        reserved_bytes_ = bytes;
        chunk_bytes_ =
            request_.open().max_chunk_bytes() == 0
                ? limits.default_chunk_bytes
                : std::min<int64_t>(request_.open().max_chunk_bytes(), limits.max_chunk_bytes);
        session_id_ = absl::StrCat("s", service_->next_id_.fetch_add(1));
        return Submit([this, work = std::move(work)]() {
          SessionOpenOutput opened;
          auto s = service_->backend_->OpenSession(work, &opened);
          service_->metrics_->SessionCall("open", s.ok() ? "ok" : "refused");
          if (!s.ok()) return s.status();
          session_ = std::shared_ptr<LiveSession>(std::move(*s));
          AppendChunks(opened.states, chunk_bytes_, out_);
          v1::SessionOpened* o = out_.emplace_back().mutable_opened();
          o->set_session_id(session_id_);
          TokenIdsToProto(work.prompt, o->mutable_prompt_token_ids());
          o->set_next_token(static_cast<int32_t>(opened.next_token));
          o->set_capacity(static_cast<uint32_t>(opened.capacity));
          o->set_max_draft_tokens(static_cast<uint32_t>(work.max_draft_tokens));
          TokenIdsToProto(service_->backend_->eos_token_ids(), o->mutable_eos_token_ids());
          o->set_state_rows(static_cast<uint32_t>(StateRows(opened.states)));
          return absl::OkStatus();
        });
      }
      case v1::SessionRequest::kVerify: {
        if (!session_) return absl::FailedPreconditionError("verify: open the session first");
        const v1::SessionVerify& v = request_.verify();
        VerifyWork work;
        work.tokens = TokenIdsFromProto(v.draft_tokens());
        work.parents.assign(v.parents().begin(), v.parents().end());
        work.commit_accepted = v.commit_accepted();
        absl::StatusOr<DraftRule> rule_in = DraftRuleFromProto(v.rule());
        if (!rule_in.ok()) {
          RefuseLocked(absl::InvalidArgumentError(
              absl::StrCat("verify.rule: ", rule_in.status().message())));
          WriteNextLocked();
          return absl::OkStatus();
        }
        work.rule = *rule_in;
        if (v.draft_probs().size() % sizeof(float) != 0) {
          RefuseLocked(absl::InvalidArgumentError(absl::StrCat(
              "verify.draft_probs: ", v.draft_probs().size(), " bytes are not float32 values")));
          WriteNextLocked();
          return absl::OkStatus();
        }
        work.draft_probs.resize(v.draft_probs().size() / sizeof(float));
        std::memcpy(work.draft_probs.data(), v.draft_probs().data(), v.draft_probs().size());
        const std::string rule = !work.parents.empty()                        ? "tree"
                                 : work.rule == DraftRule::kDraftDistribution ? "draft_distribution"
                                                                              : "argmax_draft";
        return Submit([this, work = std::move(work), rule]() {
          auto r = session_->Verify(work);
          service_->metrics_->SessionCall("verify", r.ok() ? "ok" : "refused");
          if (r.ok()) {
            service_->metrics_->SessionTokens(static_cast<int64_t>(work.tokens.size()), r->accepted,
                                              r->committed ? r->committed->rollback_tokens : 0);
          }
          if (!r.ok()) {
            RefuseLocked(r.status());
            return absl::OkStatus();
          }
          AppendChunks(r->states, chunk_bytes_, out_);
          v1::SessionVerified* o = out_.emplace_back().mutable_verified();
          o->set_position(static_cast<uint32_t>(r->position));
          o->set_accepted(static_cast<uint32_t>(r->accepted));
          TokenIdsToProto(r->accepted_tokens, o->mutable_accepted_tokens());
          o->mutable_path()->Add(r->path.begin(), r->path.end());
          o->set_next_token(static_cast<int32_t>(r->next_token));
          TokenIdsToProto(r->target_argmax, o->mutable_target_argmax());
          o->set_rule(rule);
          o->set_state_rows(static_cast<uint32_t>(StateRows(r->states)));
          if (r->committed) SessionCommittedToProto(*r->committed, o->mutable_committed());
          return absl::OkStatus();
        });
      }
      case v1::SessionRequest::kCommit: {
        if (!session_) return absl::FailedPreconditionError("commit: open the session first");
        const int64_t n = request_.commit().accepted();
        return Submit([this, n]() {
          auto r = session_->Commit(n);
          service_->metrics_->SessionCall("commit", r.ok() ? "ok" : "refused");
          if (r.ok()) service_->metrics_->SessionTokens(0, 0, r->rollback_tokens);
          if (!r.ok()) {
            RefuseLocked(r.status());
            return absl::OkStatus();
          }
          SessionCommittedToProto(*r, out_.emplace_back().mutable_committed());
          return absl::OkStatus();
        });
      }
      case v1::SessionRequest::MESSAGE_NOT_SET:
        break;
    }
    return absl::InvalidArgumentError("request: none of open, verify, commit is set");
  }

  // Queues `call` on the worker. It runs with mu_ released by the worker's caller and takes it
  // itself around the answers; an error ends the stream with that status.
  absl::Status Submit(std::function<absl::Status()> call) {
    auto job = std::make_shared<Job>();
    job->kind = Job::Kind::kSession;
    job->deadline = deadline_;
    job->session_call = [this, call = std::move(call)](absl::Status runnable) {
      absl::Status s = runnable;
      if (s.ok()) {
        bool skip;
        {
          std::lock_guard<std::mutex> lock(mu_);
          skip = cancelled_ || finished_;
        }
        // The call runs without mu_ (a forward): only this stream's worker call touches the
        // session and out_ until it is done, and busy_ keeps every other path away.
        if (!skip) s = call();
      }
      std::lock_guard<std::mutex> lock(mu_);
      job_.reset();
      if (!s.ok()) {
        FinishLocked(ToGrpcStatus(s));
        return;
      }
      if (cancelled_) {
        FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
        return;
      }
      WriteNextLocked();
    };
    job_ = job;
    absl::Status queued = service_->scheduler_->Submit(job);
    if (!queued.ok()) job_.reset();
    return queued;
  }

  SessionService* service_;
  const std::chrono::steady_clock::time_point deadline_;
  std::mutex mu_;
  v1::SessionRequest request_;
  std::deque<v1::SessionResponse> out_;  // answers not yet written, the one in flight first
  std::shared_ptr<LiveSession> session_;
  std::shared_ptr<Job> job_;  // the call queued or running
  std::string session_id_;
  int64_t chunk_bytes_ = 1 << 20;
  std::chrono::steady_clock::time_point last_activity_;
  bool busy_ = false;  // a call is queued or running, or its answers are being written
  bool cancelled_ = false;
  bool finished_ = false;
  bool holds_slot_ = false;
  int64_t reserved_bytes_ = 0;  // of --session_cache_bytes, while holds_slot_
};

SessionService::SessionService(ExtractorBackend* backend, Scheduler* scheduler,
                               ExtractorMetrics* metrics, SessionLimits limits,
                               OpenValidator validate_open)
    : backend_(backend),
      scheduler_(scheduler),
      metrics_(metrics),
      limits_(limits),
      validate_open_(std::move(validate_open)),
      idle_thread_([this] { IdleLoop(); }) {}

SessionService::~SessionService() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  idle_thread_.join();
}

grpc::ServerBidiReactor<v1::SessionRequest, v1::SessionResponse>* SessionService::Start(
    grpc::CallbackServerContext* ctx) {
  return new Reactor(this, ctx);
}

absl::Status SessionService::Acquire(int64_t bytes) {
  std::lock_guard<std::mutex> lock(slots_mu_);
  if (open_sessions_.load() >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("open: ", limits_.max_sessions,
                     " sessions are open, the limit (--max_sessions); retry later"));
  }
  if (reserved_bytes_ + bytes > limits_.max_cache_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "open: the session's cache (", bytes,
        " bytes for its capacity) does not fit: ", reserved_bytes_, " of ", limits_.max_cache_bytes,
        " bytes are held by open sessions (--session_cache_bytes); retry later or ask for "
        "fewer max_new_tokens"));
  }
  reserved_bytes_ += bytes;
  metrics_->SetOpenSessions(open_sessions_.fetch_add(1) + 1);
  return absl::OkStatus();
}

void SessionService::Release(int64_t bytes) {
  std::lock_guard<std::mutex> lock(slots_mu_);
  reserved_bytes_ -= bytes;
  metrics_->SetOpenSessions(open_sessions_.fetch_sub(1) - 1);
}

void SessionService::Register(Reactor* r) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.insert(r);
}

void SessionService::Unregister(Reactor* r) {
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(r);
}

void SessionService::IdleLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const double idle = limits_.idle_seconds;
    const auto period = std::chrono::milliseconds(
        draining_  ? 50
        : idle > 0 ? std::clamp<int64_t>(static_cast<int64_t>(idle * 250), 10, 1000)
                   : 1000);
    cv_.wait_for(lock, period, [&] { return stopping_; });
    if (stopping_ || (idle <= 0 && !draining_)) continue;
    const auto now = std::chrono::steady_clock::now();
    for (Reactor* r : live_) r->ExpireIfIdle(now, idle);
  }
}

void SessionService::BeginDrain() {
  draining_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  for (Reactor* r : live_) r->ExpireIfIdle(now, limits_.idle_seconds);
}

}  // namespace specwire

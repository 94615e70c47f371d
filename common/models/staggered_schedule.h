// Continuous batching's schedule driven by hand, for the batch-invariance test and benchmark:
// sequences arrive at staggered steps, one pending prompt advances by a prefill chunk per step,
// and every decoding sequence takes one token per step in a shuffled row order. Each sequence's
// logits, step by step, must equal those of the sequence decoded alone.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "common/models/generate.h"

namespace specwire {

struct StaggeredCase {
  std::vector<int64_t> prompt;
  int64_t max_new_tokens = 0;
  int64_t arrival = 0;  // the step at which it is submitted
};

// Greedy decoding to max_new_tokens, the model's eos ignored.
inline GenerateOptions NoStops(int64_t max_new_tokens) {
  GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.use_config_eos = false;
  return o;
}

// Every step's logits (the prompt's last position, then one per decoded token), on the host.
using StepLogits = std::vector<at::Tensor>;

// One sequence decoded alone.
inline absl::StatusOr<StepLogits> DecodeAlone(DecoderModel& model, const StaggeredCase& c) {
  absl::StatusOr<std::unique_ptr<GreedySequence>> seq =
      GreedySequence::Start(model, c.prompt, NoStops(c.max_new_tokens));
  if (!seq.ok()) return seq.status();
  StepLogits logits;
  while ((*seq)->pending_prompt_tokens() > 0) (*seq)->PrefillChunk();
  logits.push_back((*seq)->last_logits().cpu());
  while ((*seq)->decoding()) {
    DecodeStep(model, {seq->get()});
    logits.push_back((*seq)->last_logits().cpu());
  }
  return logits;
}

struct StaggeredRun {
  std::vector<StepLogits> logits;  // per case
  std::vector<std::unique_ptr<GreedySequence>> sequences;
  int64_t max_rows = 0;  // the most rows one step decoded together
};

// The schedule over at most max_steps steps; `shuffle` orders each step's rows.
inline absl::StatusOr<StaggeredRun> RunStaggered(DecoderModel& model,
                                                 const std::vector<StaggeredCase>& cases,
                                                 std::mt19937_64& shuffle, int64_t max_steps) {
  StaggeredRun run;
  std::vector<std::unique_ptr<GreedySequence>>& seqs = run.sequences;
  seqs.resize(cases.size());
  run.logits.resize(cases.size());
  for (int64_t step = 0; step < max_steps; ++step) {
    for (size_t i = 0; i < cases.size(); ++i) {
      if (cases[i].arrival == step) {
        auto s = GreedySequence::Start(model, cases[i].prompt, NoStops(cases[i].max_new_tokens));
        if (!s.ok()) return s.status();
        seqs[i] = std::move(*s);
      }
    }
    for (size_t i = 0; i < cases.size(); ++i) {
      if (seqs[i] && seqs[i]->pending_prompt_tokens() > 0) {
        seqs[i]->PrefillChunk();
        if (seqs[i]->pending_prompt_tokens() == 0) {
          run.logits[i].push_back(seqs[i]->last_logits().cpu());
        }
        break;
      }
    }
    std::vector<size_t> rows;
    for (size_t i = 0; i < cases.size(); ++i) {
      if (seqs[i] && seqs[i]->decoding() && !run.logits[i].empty()) rows.push_back(i);
    }
    std::shuffle(rows.begin(), rows.end(), shuffle);
    std::vector<GreedySequence*> batch;
    for (size_t i : rows) batch.push_back(seqs[i].get());
    run.max_rows = std::max<int64_t>(run.max_rows, static_cast<int64_t>(batch.size()));
    DecodeStep(model, batch);
    for (size_t i : rows) run.logits[i].push_back(seqs[i]->last_logits().cpu());
    bool done = true;
    for (size_t i = 0; i < cases.size(); ++i) done &= seqs[i] && seqs[i]->finished();
    if (done) break;
  }
  return run;
}

}  // namespace specwire

#include "services/scorer/scorer_convert.h"

#include "proto/convert.h"

namespace specwire {

void PromptScoreToProto(const PromptScore& s, v1::PromptResult* out) {
  out->set_trajectory_digest(s.trajectory_digest);
  out->set_prompt_index(static_cast<uint32_t>(s.prompt_index));
  out->set_prompt_tokens(static_cast<uint32_t>(s.acceptance.prompt_tokens));
  out->set_completion_tokens(static_cast<uint32_t>(s.acceptance.completion_tokens));
  for (int32_t v : s.acceptance.step_lengths) out->add_step_lengths(static_cast<uint32_t>(v));
  out->set_tau(s.tau);
  for (const auto& [budget, lengths] : s.acceptance.ddtree_step_lengths) {
    auto& l = (*out->mutable_ddtree_step_lengths())[static_cast<uint32_t>(budget)];
    for (int32_t v : lengths) l.add_lengths(static_cast<uint32_t>(v));
  }
  out->set_finish_reason(s.finish_reason);
  for (int64_t t : CompletionTokens(s)) out->add_completion_token_ids(static_cast<int32_t>(t));
  if (const std::optional<PredictedAcceptance>& p = s.acceptance.predicted) {
    v1::PredictedAcceptanceRecord* r = out->mutable_predicted_acceptance();
    for (size_t i = 0; i < p->accepted.size() && i < p->predicted.size(); ++i) {
      r->add_accepted(static_cast<uint32_t>(p->accepted[i]));
      r->add_drafts(static_cast<uint32_t>(p->predicted[i].size()));
      for (float c : p->predicted[i]) r->add_predicted(c);
    }
    for (const auto& [cutoff, lengths] : p->cut_step_lengths) {
      v1::CutoffSteps* c = r->add_cutoffs();
      c->set_cutoff(cutoff);
      for (int32_t v : lengths) c->add_step_lengths(static_cast<uint32_t>(v));
    }
  }
}

PromptScore PromptScoreFromProto(const v1::PromptResult& p) {
  PromptScore s;
  s.prompt_index = p.prompt_index();
  s.acceptance.prompt_tokens = p.prompt_tokens();
  s.acceptance.completion_tokens = p.completion_tokens();
  s.acceptance.step_lengths.assign(p.step_lengths().begin(), p.step_lengths().end());
  s.trajectory_digest = p.trajectory_digest();
  for (const auto& [budget, lengths] : p.ddtree_step_lengths()) {
    s.acceptance.ddtree_step_lengths[static_cast<int32_t>(budget)].assign(lengths.lengths().begin(),
                                                                          lengths.lengths().end());
  }
  s.tau = p.tau();
  s.finish_reason = p.finish_reason();
  s.completion_tokens.assign(p.completion_token_ids().begin(), p.completion_token_ids().end());
  if (p.has_predicted_acceptance()) {
    const v1::PredictedAcceptanceRecord& r = p.predicted_acceptance();
    PredictedAcceptance x;
    int offset = 0;
    for (int i = 0; i < r.accepted_size() && i < r.drafts_size(); ++i) {
      x.accepted.push_back(static_cast<int32_t>(r.accepted(i)));
      const int n = std::min<int>(static_cast<int>(r.drafts(i)), r.predicted_size() - offset);
      x.predicted.emplace_back(r.predicted().begin() + offset, r.predicted().begin() + offset + n);
      offset += n;
    }
    for (const v1::CutoffSteps& c : r.cutoffs()) {
      x.cut_step_lengths[c.cutoff()].assign(c.step_lengths().begin(), c.step_lengths().end());
    }
    s.acceptance.predicted = std::move(x);
  }
  return s;
}

void ProgressToProto(const ScoreProgress& p, v1::Progress* out) {
  out->set_prompts_done(static_cast<uint32_t>(p.done));
  out->set_prompts_total(static_cast<uint32_t>(p.total));
  out->set_steps(static_cast<uint64_t>(p.steps));
  out->set_tau_so_far(p.tau_so_far);
}

void SummaryToProto(const AcceptanceSummary& s, v1::AcceptanceSummary* out) {
  out->set_block_size(static_cast<uint32_t>(s.block_size));
  out->set_responses(static_cast<uint64_t>(s.responses));
  out->set_steps(static_cast<uint64_t>(s.steps));
  out->set_tau_mean_of_means(s.tau_mean_of_means);
  out->set_tau_pooled(s.tau_pooled);
  for (int64_t v : s.histogram) out->add_histogram(static_cast<uint64_t>(v));
  for (double v : s.per_position_acceptance) out->add_per_position_acceptance(v);
  out->set_num_drafts(static_cast<uint64_t>(s.num_drafts));
  out->set_num_draft_tokens(static_cast<uint64_t>(s.num_draft_tokens));
  out->set_num_accepted_tokens(static_cast<uint64_t>(s.num_accepted_tokens));
  for (int64_t v : s.num_accepted_tokens_per_pos)
    out->add_num_accepted_tokens_per_pos(static_cast<uint64_t>(v));
  out->set_acceptance_rate(s.acceptance_rate);
  for (const auto& [budget, tau] : s.ddtree_tau) {
    (*out->mutable_ddtree_tau())[static_cast<uint32_t>(budget)] = tau.first;
    (*out->mutable_ddtree_tau_pooled())[static_cast<uint32_t>(budget)] = tau.second;
  }
  auto set_interval = [](const std::optional<Interval>& i, v1::Interval* out) {
    out->set_lo(i->lo);
    out->set_hi(i->hi);
  };
  if (s.tau_mean_of_means_ci) set_interval(s.tau_mean_of_means_ci, out->mutable_tau_mean_of_means_ci());
  if (s.tau_pooled_ci) set_interval(s.tau_pooled_ci, out->mutable_tau_pooled_ci());
  for (const auto& [budget, ci] : s.ddtree_tau_ci) {
    const uint32_t b = static_cast<uint32_t>(budget);
    if (ci.first) set_interval(ci.first, &(*out->mutable_ddtree_tau_ci())[b]);
    if (ci.second) set_interval(ci.second, &(*out->mutable_ddtree_tau_pooled_ci())[b]);
  }
  for (int64_t v : s.per_position_reached) out->add_per_position_reached(static_cast<uint64_t>(v));
  out->set_bootstrap_resamples(static_cast<uint32_t>(std::max(0, s.options.bootstrap.resamples)));
  out->set_bootstrap_seed(s.options.bootstrap.seed);
  out->set_confidence(s.options.bootstrap.confidence);
  out->set_token_window(static_cast<uint32_t>(std::max<int64_t>(0, s.options.token_window)));
  for (const TokenWindow& w : s.windows) {
    auto* o = out->add_windows();
    o->set_first_token(static_cast<uint32_t>(w.first_token));
    o->set_last_token(static_cast<uint32_t>(w.last_token));
    o->set_responses(static_cast<uint64_t>(w.tau.responses));
    o->set_steps(static_cast<uint64_t>(w.tau.steps));
    o->set_tau_mean_of_means(w.tau.mean_of_means);
    o->set_tau_pooled(w.tau.pooled);
    if (w.tau.mean_of_means_ci) set_interval(w.tau.mean_of_means_ci, o->mutable_tau_mean_of_means_ci());
    if (w.tau.pooled_ci) set_interval(w.tau.pooled_ci, o->mutable_tau_pooled_ci());
  }
  out->set_tree_method(s.tree_method);
  out->set_tree_depth(static_cast<uint32_t>(std::max(0, s.tree_depth)));
  out->set_tree_top_k(static_cast<uint32_t>(std::max(0, s.tree_top_k)));
  out->set_loop(s.loop);
  if (s.live) {
    v1::LiveLoopSummary* l = out->mutable_live();
    l->mutable_sampling()->set_temperature(s.live->setting.temperature);
    l->mutable_sampling()->set_top_p(s.live->setting.top_p);
    l->mutable_sampling()->set_top_k(static_cast<uint32_t>(std::max(0, s.live->setting.top_k)));
    l->set_rule(s.live->rule);
    l->set_seed(s.live->seed);
    l->set_verify_calls(static_cast<uint64_t>(s.live->verify_calls));
    l->set_drafted_tokens(static_cast<uint64_t>(s.live->drafted_tokens));
    l->set_accepted_tokens(static_cast<uint64_t>(s.live->accepted_tokens));
    l->set_drafter_seconds(s.live->drafter_seconds);
    l->set_target_seconds(s.live->target_seconds);
    l->set_self_check_prompts(static_cast<uint32_t>(s.live->self_check_prompts));
    l->set_self_check_matching(static_cast<uint32_t>(s.live->self_check_matching));
    for (int64_t i : s.live->self_check_mismatches) {
      l->add_self_check_mismatches(static_cast<uint32_t>(i));
    }
  }
  for (const TemperatureSummary& t : s.temperature) {
    auto* o = out->add_temperature();
    o->mutable_setting()->set_temperature(t.setting.temperature);
    o->mutable_setting()->set_top_p(t.setting.top_p);
    o->mutable_setting()->set_top_k(static_cast<uint32_t>(std::max(0, t.setting.top_k)));
    o->set_rule(t.rule);
    o->set_blocks(static_cast<uint64_t>(t.blocks));
    o->set_tau_prob(t.tau_prob);
    if (t.tau_prob_ci) set_interval(t.tau_prob_ci, o->mutable_tau_prob_ci());
    o->set_tau_prob_pooled(t.tau_prob_pooled);
    for (double a : t.alpha) o->add_alpha(a);
    for (int64_t n : t.alpha_blocks) o->add_alpha_blocks(static_cast<uint64_t>(n));
  }
  if (s.predicted_acceptance) {
    v1::PredictedAcceptanceSummary* p = out->mutable_predicted_acceptance();
    for (const CalibrationRow& row : s.predicted_acceptance->calibration) {
      v1::CalibrationRow* o = p->add_calibration();
      o->set_position(static_cast<uint32_t>(row.position));
      o->set_blocks(static_cast<uint64_t>(row.blocks));
      o->set_predicted(row.predicted);
      o->set_observed(row.observed);
    }
    for (const CutoffTau& c : s.predicted_acceptance->cutoffs) {
      v1::CutoffTau* o = p->add_cutoffs();
      o->set_cutoff(c.cutoff);
      o->set_responses(static_cast<uint64_t>(c.tau.responses));
      o->set_steps(static_cast<uint64_t>(c.tau.steps));
      o->set_tau_mean_of_means(c.tau.mean_of_means);
      if (c.tau.mean_of_means_ci) {
        set_interval(c.tau.mean_of_means_ci, o->mutable_tau_mean_of_means_ci());
      }
      o->set_tau_pooled(c.tau.pooled);
      if (c.tau.pooled_ci) set_interval(c.tau.pooled_ci, o->mutable_tau_pooled_ci());
    }
  }
}

AcceptanceSummary SummaryFromProto(const v1::AcceptanceSummary& p) {
  AcceptanceSummary s;
  auto interval = [](bool has, const v1::Interval& i) {
    return has ? std::optional<Interval>(Interval{i.lo(), i.hi()}) : std::nullopt;
  };
  s.tau_mean_of_means_ci = interval(p.has_tau_mean_of_means_ci(), p.tau_mean_of_means_ci());
  s.tau_pooled_ci = interval(p.has_tau_pooled_ci(), p.tau_pooled_ci());
  for (const auto& [b, ci] : p.ddtree_tau_ci()) {
    s.ddtree_tau_ci[static_cast<int32_t>(b)].first = interval(true, ci);
  }
  for (const auto& [b, ci] : p.ddtree_tau_pooled_ci()) {
    s.ddtree_tau_ci[static_cast<int32_t>(b)].second = interval(true, ci);
  }
  s.per_position_reached.assign(p.per_position_reached().begin(), p.per_position_reached().end());
  s.options.bootstrap.resamples = static_cast<int32_t>(p.bootstrap_resamples());
  s.options.bootstrap.seed = p.bootstrap_seed();
  if (p.confidence() > 0) s.options.bootstrap.confidence = p.confidence();
  s.options.token_window = p.token_window();
  for (const auto& w : p.windows()) {
    TokenWindow t;
    t.first_token = w.first_token();
    t.last_token = w.last_token();
    t.tau.responses = static_cast<int64_t>(w.responses());
    t.tau.steps = static_cast<int64_t>(w.steps());
    t.tau.mean_of_means = w.tau_mean_of_means();
    t.tau.pooled = w.tau_pooled();
    t.tau.mean_of_means_ci = interval(w.has_tau_mean_of_means_ci(), w.tau_mean_of_means_ci());
    t.tau.pooled_ci = interval(w.has_tau_pooled_ci(), w.tau_pooled_ci());
    s.windows.push_back(t);
  }
  for (const auto& x : p.temperature()) {
    TemperatureSummary t;
    t.setting.temperature = x.setting().temperature();
    t.setting.top_p = x.setting().top_p();
    t.setting.top_k = static_cast<int32_t>(x.setting().top_k());
    t.rule = x.rule();
    t.blocks = static_cast<int64_t>(x.blocks());
    t.tau_prob = x.tau_prob();
    t.tau_prob_ci = interval(x.has_tau_prob_ci(), x.tau_prob_ci());
    t.tau_prob_pooled = x.tau_prob_pooled();
    t.alpha.assign(x.alpha().begin(), x.alpha().end());
    t.alpha_blocks.assign(x.alpha_blocks().begin(), x.alpha_blocks().end());
    s.temperature.push_back(t);
  }
  if (p.has_predicted_acceptance()) {
    PredictedAcceptanceSummary x;
    for (const v1::CalibrationRow& row : p.predicted_acceptance().calibration()) {
      x.calibration.push_back({static_cast<int32_t>(row.position()),
                               static_cast<int64_t>(row.blocks()), row.predicted(),
                               row.observed()});
    }
    for (const v1::CutoffTau& c : p.predicted_acceptance().cutoffs()) {
      CutoffTau t;
      t.cutoff = c.cutoff();
      t.tau.responses = static_cast<int64_t>(c.responses());
      t.tau.steps = static_cast<int64_t>(c.steps());
      t.tau.mean_of_means = c.tau_mean_of_means();
      t.tau.mean_of_means_ci = interval(c.has_tau_mean_of_means_ci(), c.tau_mean_of_means_ci());
      t.tau.pooled = c.tau_pooled();
      t.tau.pooled_ci = interval(c.has_tau_pooled_ci(), c.tau_pooled_ci());
      x.cutoffs.push_back(t);
    }
    s.predicted_acceptance = std::move(x);
  }
  if (!p.loop().empty()) s.loop = p.loop();
  if (p.has_live()) {
    LiveSummary l;
    l.setting.temperature = p.live().sampling().temperature();
    l.setting.top_p = p.live().sampling().top_p();
    l.setting.top_k = static_cast<int32_t>(p.live().sampling().top_k());
    l.rule = p.live().rule();
    l.seed = p.live().seed();
    l.verify_calls = static_cast<int64_t>(p.live().verify_calls());
    l.drafted_tokens = static_cast<int64_t>(p.live().drafted_tokens());
    l.accepted_tokens = static_cast<int64_t>(p.live().accepted_tokens());
    l.drafter_seconds = p.live().drafter_seconds();
    l.target_seconds = p.live().target_seconds();
    l.self_check_prompts = p.live().self_check_prompts();
    l.self_check_matching = p.live().self_check_matching();
    l.self_check_mismatches.assign(p.live().self_check_mismatches().begin(),
                                   p.live().self_check_mismatches().end());
    s.live = l;
  }
  s.tree_method = p.tree_method();
  s.tree_depth = static_cast<int32_t>(p.tree_depth());
  s.tree_top_k = static_cast<int32_t>(p.tree_top_k());
  s.block_size = static_cast<int32_t>(p.block_size());
  s.responses = static_cast<int64_t>(p.responses());
  s.steps = static_cast<int64_t>(p.steps());
  s.tau_mean_of_means = p.tau_mean_of_means();
  s.tau_pooled = p.tau_pooled();
  s.histogram.assign(p.histogram().begin(), p.histogram().end());
  s.per_position_acceptance.assign(p.per_position_acceptance().begin(),
                                   p.per_position_acceptance().end());
  s.num_drafts = static_cast<int64_t>(p.num_drafts());
  s.num_draft_tokens = static_cast<int64_t>(p.num_draft_tokens());
  s.num_accepted_tokens = static_cast<int64_t>(p.num_accepted_tokens());
  s.num_accepted_tokens_per_pos.assign(p.num_accepted_tokens_per_pos().begin(),
                                       p.num_accepted_tokens_per_pos().end());
  s.acceptance_rate = p.acceptance_rate();
  for (const auto& [budget, tau] : p.ddtree_tau()) {
    auto pooled = p.ddtree_tau_pooled().find(budget);
    s.ddtree_tau[static_cast<int32_t>(budget)] = {
        tau, pooled == p.ddtree_tau_pooled().end() ? 0.0 : pooled->second};
  }
  return s;
}

ScoreSpec SpecFromProto(const v1::ScoreRequest& r) {
  ScoreSpec s;
  s.drafter_path = r.drafter_path();
  for (const auto& p : r.prompts()) {
    if (p.input_case() == v1::PromptInput::kText) {
      s.prompts.push_back(InputSequence::Text(p.text()));
    } else {
      s.prompts.push_back(InputSequence::Tokens(
          std::vector<int64_t>(p.tokens().ids().begin(), p.tokens().ids().end())));
    }
  }
  s.dataset_path = r.dataset_path();
  s.max_new_tokens = r.max_new_tokens() == 0 ? 256 : r.max_new_tokens();
  if (r.ddtree_budgets_size() > 0) {
    s.ddtree_budgets.clear();
    for (uint32_t b : r.ddtree_budgets()) {
      s.ddtree_budgets.push_back(static_cast<int32_t>(std::min<uint32_t>(b, INT32_MAX)));
    }
  }
  s.tree_depth = static_cast<int32_t>(std::min<uint32_t>(r.tree_depth(), INT32_MAX));
  s.tree_top_k = static_cast<int32_t>(std::min<uint32_t>(r.tree_top_k(), INT32_MAX));
  s.labels.drafter = r.drafter_label();
  s.labels.dataset = r.dataset_label();
  s.labels.method = r.method_label();
  s.add_special_tokens = r.add_special_tokens();
  s.max_prompts = r.max_prompts();
  s.job_id = r.job_id();
  if (r.has_bootstrap_resamples()) {
    s.summary.bootstrap.resamples =
        static_cast<int32_t>(std::min<uint32_t>(r.bootstrap_resamples(), INT32_MAX));
  }
  s.summary.bootstrap.seed = r.bootstrap_seed();
  s.chat_template_record = r.chat_template_record();
  if (r.has_token_window()) s.summary.token_window = r.token_window();
  for (const v1::SamplingSetting& x : r.sampling()) {
    SamplingSetting t;
    t.temperature = x.temperature();
    t.top_p = x.top_p() == 0 ? 1.0 : x.top_p();
    t.top_k = static_cast<int32_t>(std::min<uint32_t>(x.top_k(), INT32_MAX));
    s.sampling.push_back(t);
  }
  s.predicted_cutoffs.assign(r.predicted_acceptance_cutoffs().begin(),
                             r.predicted_acceptance_cutoffs().end());
  if (r.has_live()) {
    s.live.enabled = true;
    s.live.setting.temperature = r.live().sampling().temperature();
    s.live.setting.top_p = r.live().sampling().top_p() == 0 ? 1.0 : r.live().sampling().top_p();
    s.live.setting.top_k =
        static_cast<int32_t>(std::min<uint32_t>(r.live().sampling().top_k(), INT32_MAX));
    if (!r.live().rule().empty()) s.live.rule = r.live().rule();
    s.live.seed = r.live().seed();
    if (r.live().has_self_check_prompts()) {
      s.live.self_check_prompts = r.live().self_check_prompts();
    }
  }
  return s;
}

void SpecToProto(const ScoreSpec& s, v1::ScoreRequest* out) {
  out->set_drafter_path(s.drafter_path);
  for (const InputSequence& p : s.prompts) {
    auto* in = out->add_prompts();
    if (p.is_text) {
      in->set_text(p.text);
    } else {
      for (int64_t id : p.token_ids) in->mutable_tokens()->add_ids(static_cast<int32_t>(id));
    }
  }
  out->set_dataset_path(s.dataset_path);
  out->set_max_new_tokens(static_cast<uint32_t>(s.max_new_tokens));
  for (int32_t b : s.ddtree_budgets) out->add_ddtree_budgets(static_cast<uint32_t>(b));
  out->set_tree_depth(static_cast<uint32_t>(std::max(0, s.tree_depth)));
  out->set_tree_top_k(static_cast<uint32_t>(std::max(0, s.tree_top_k)));
  out->set_bootstrap_resamples(static_cast<uint32_t>(std::max(0, s.summary.bootstrap.resamples)));
  out->set_bootstrap_seed(s.summary.bootstrap.seed);
  out->set_chat_template_record(s.chat_template_record);
  out->set_token_window(static_cast<uint32_t>(std::max<int64_t>(0, s.summary.token_window)));
  for (const SamplingSetting& x : s.sampling) {
    auto* t = out->add_sampling();
    t->set_temperature(x.temperature);
    t->set_top_p(x.top_p);
    t->set_top_k(static_cast<uint32_t>(std::max(0, x.top_k)));
  }
  for (double c : s.predicted_cutoffs) out->add_predicted_acceptance_cutoffs(c);
  if (s.live.enabled) {
    v1::LiveLoop* l = out->mutable_live();
    l->mutable_sampling()->set_temperature(s.live.setting.temperature);
    l->mutable_sampling()->set_top_p(s.live.setting.top_p);
    l->mutable_sampling()->set_top_k(static_cast<uint32_t>(std::max(0, s.live.setting.top_k)));
    l->set_rule(s.live.rule);
    l->set_seed(s.live.seed);
    l->set_self_check_prompts(
        static_cast<uint32_t>(std::max<int64_t>(0, s.live.self_check_prompts)));
  }
  out->set_drafter_label(s.labels.drafter);
  out->set_dataset_label(s.labels.dataset);
  out->set_method_label(s.labels.method);
  out->set_add_special_tokens(s.add_special_tokens);
  out->set_max_prompts(static_cast<uint32_t>(s.max_prompts));
  out->set_job_id(s.job_id);
}

}  // namespace specwire

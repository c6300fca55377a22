// Policy decisions (see policy.h).
#include "worker/stability/policy.h"

#include <algorithm>

namespace keel {

const char* ActionName(PolicyAction::Kind kind) {
  switch (kind) {
    case PolicyAction::Kind::kSwitch: return "switch";
    case PolicyAction::Kind::kRollback: return "rollback";
    case PolicyAction::Kind::kScaleLr: return "scale_lr";
    case PolicyAction::Kind::kSkipStep: return "skip_step";
    case PolicyAction::Kind::kStop: return "stop";
  }
  return "?";
}

std::vector<PolicyEngine::Decision> PolicyEngine::Decide(int64_t step, const std::vector<Firing>& fired) {
  std::vector<Decision> out;
  for (const PolicyRule& rule : policy_.rules) {
    if (exhausted()) break;
    Decision d;
    d.rule = &rule;
    for (const std::string& name : rule.when) {
      for (const Firing& f : fired) {
        if (f.detector == name) d.firings.push_back(f);
      }
    }
    std::vector<std::string> names;
    for (const Firing& f : d.firings) names.push_back(f.detector);
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    const bool match = rule.match_all ? names.size() == rule.when.size() : !names.empty();
    if (!match) continue;
    auto last = last_fired_.find(rule.name);
    if (last != last_fired_.end() && step - last->second < rule.cooldown) continue;
    if (rule.max > 0 && times_[rule.name] >= rule.max) continue;
    last_fired_[rule.name] = step;
    ++times_[rule.name];
    ++interventions_;
    out.push_back(std::move(d));
  }
  return out;
}

std::string PolicyEngine::NextRung(const std::string& scheme) const {
  const auto& ladder = policy_.ladder;
  auto it = std::find(ladder.begin(), ladder.end(), scheme);
  // A scheme off the ladder (a custom one, say) moves to its top rung, the most precise.
  if (it == ladder.end()) return ladder.empty() ? "" : ladder.back();
  ++it;
  return it == ladder.end() ? "" : *it;
}

}  // namespace keel

// StepMetrics as one JSON line (see step_metrics.h and docs/train.md).
#include "worker/run/step_metrics.h"

#include <algorithm>
#include <cmath>

#include "worker/io/json.h"

namespace keel {

std::string StepMetrics::ToJson() const {
  JsonWriter w;
  w.Add("step", step);
  if (attempt > 0) w.Add("attempt", attempt);
  w.Add("unix_ms", unix_ms).Add("loss", loss).Add("lr", lr).Add("tokens_per_s", tokens_per_s);
  w.Add("step_ms", step_seconds * 1e3).Add("scheme", scheme).Add("grad_norm", grad_norm);
  auto groups = [](const std::vector<GroupValue>& values) {
    JsonValue object = JsonValue::Object();
    for (const GroupValue& g : values) object.Set(g.name, g.value);
    return object;
  };
  w.Add("grad_norm_layers", groups(grad_norms));
  w.Add("update_ratio", update_ratio);
  w.Add("update_ratio_layers", groups(update_ratios));
  JsonValue ln = JsonValue::Object();
  for (const LnGamma& g : ln_gamma) {
    JsonValue v = JsonValue::Object();
    v.Set("mean", g.mean);
    v.Set("std", g.std);
    ln.Set(g.name, v);
  }
  w.Add("ln_gamma", ln);
  JsonValue ops = JsonValue::Object();
  for (const OperandMetric& o : operands) {
    JsonValue v = JsonValue::Object();
    v.Set("saturated", o.saturated);
    v.Set("nan_blocks", o.nan_blocks);
    JsonValue layer = ops.Find(o.linear) ? *ops.Find(o.linear) : JsonValue::Object();
    layer.Set(RoleName(o.role), v);
    ops.Set(o.linear, layer);
  }
  w.Add("quant", ops);
  if (!outliers.empty()) {
    // Entries come layer by layer (slot order): one object per layer, in order.
    JsonValue analytics = JsonValue::Object(), layer = JsonValue::Object();
    for (size_t i = 0; i < outliers.size(); ++i) {
      const OutlierMetric& o = outliers[i];
      JsonValue v = JsonValue::Object();
      v.Set("kurtosis", o.kurtosis);
      v.Set("top1_over_median", o.top1_over_median);
      v.Set("ftz_rate", o.ftz_rate);
      if (o.has_overlap) v.Set("hot_overlap", o.hot_overlap);
      JsonValue hot = JsonValue::Array();
      for (int64_t c : o.hot) hot.Append(c);
      v.Set("hot", hot);
      layer.Set(RoleName(o.role), v);
      if (i + 1 == outliers.size() || outliers[i + 1].linear != o.linear) {
        analytics.Set(o.linear, layer);
        layer = JsonValue::Object();
      }
    }
    w.Add("analytics", analytics);
  }
  if (probed) {
    JsonValue p = JsonValue::Object();
    p.Set("cosine", probe.cosine);
    p.Set("rel_error", probe.rel_error);
    p.Set("zeta", probe.zeta);
    JsonValue layers = JsonValue::Object();
    for (const ProbeLayer& l : probe_layers) {
      JsonValue v = JsonValue::Object();
      v.Set("cosine", l.values.cosine);
      v.Set("rel_error", l.values.rel_error);
      v.Set("zeta", l.values.zeta);
      layers.Set(l.name, v);
    }
    p.Set("layers", layers);
    w.Add("probe", p);
  }
  if (!rank_step_seconds.empty()) {
    JsonValue step_ms = JsonValue::Array(), comm_ms = JsonValue::Array(), exposed_ms = JsonValue::Array();
    for (double s : rank_step_seconds) step_ms.Append(s * 1e3);
    for (double s : rank_comm_seconds) comm_ms.Append(s * 1e3);
    for (double s : rank_comm_exposed_seconds) exposed_ms.Append(s * 1e3);
    w.Add("rank_step_ms", step_ms).Add("rank_comm_ms", comm_ms).Add("rank_comm_exposed_ms", exposed_ms);
  }
  if (grad_buckets > 0) {
    w.Add("grad_buckets", static_cast<int64_t>(grad_buckets));
    w.Add("grad_buckets_early", static_cast<int64_t>(grad_buckets_early));
  }
  if (evaluated) w.Add("val_loss", val_loss);
  if (skipped) w.Add("skipped", true);
  return w.str();
}

Status ParseMetricLine(const std::string& line, MetricLine* out) {
  JsonValue v;
  if (!ParseJson(line, &v).ok() || !v.is_object()) return Status::InvalidArgument("metric line: not a JSON object");
  auto number = [](const JsonValue* x) {
    double d = std::nan("");
    if (x == nullptr || !x->ToDouble(&d)) return std::nan("");
    return d;
  };
  const double step = number(v.Find("step"));
  if (!(step >= 1) || step != std::floor(step)) {
    return Status::InvalidArgument("metric line: \"step\" is missing or not an integer >= 1");
  }
  MetricLine m;
  m.step = static_cast<int64_t>(step);
  m.loss = number(v.Find("loss"));
  m.lr = number(v.Find("lr"));
  m.tokens_per_s = number(v.Find("tokens_per_s"));
  m.grad_norm = number(v.Find("grad_norm"));
  if (const JsonValue* probe = v.Find("probe")) {
    m.has_probe = true;
    m.probe_cosine = number(probe->Find("cosine"));
    m.probe_zeta = number(probe->Find("zeta"));
  }
  if (const JsonValue* quant = v.Find("quant")) {
    for (const JsonValue::Member& layer : quant->members()) {
      for (const JsonValue::Member& role : layer.second.members()) {
        m.has_saturation = true;
        m.max_saturated = std::max(m.max_saturated, number(role.second.Find("saturated")));
      }
    }
  }
  if (const JsonValue* analytics = v.Find("analytics")) {
    m.has_analytics = analytics->is_object();
    for (const JsonValue::Member& layer : analytics->members()) {
      for (const JsonValue::Member& role : layer.second.members()) {
        OutlierValue o;
        o.linear = layer.first;
        o.role = role.first;
        o.kurtosis = number(role.second.Find("kurtosis"));
        o.top1_over_median = number(role.second.Find("top1_over_median"));
        o.ftz_rate = number(role.second.Find("ftz_rate"));
        o.hot_overlap = number(role.second.Find("hot_overlap"));
        m.outliers.push_back(std::move(o));
      }
    }
  }
  for (const auto& field : {std::make_pair("rank_step_ms", &m.rank_step_seconds),
                            std::make_pair("rank_comm_ms", &m.rank_comm_seconds),
                            std::make_pair("rank_comm_exposed_ms", &m.rank_comm_exposed_seconds)}) {
    if (const JsonValue* ms = v.Find(field.first)) {
      for (const JsonValue& x : ms->array()) field.second->push_back(number(&x) / 1e3);
    }
  }
  *out = m;
  return Status::Ok();
}

bool MetricLineHasAnalytics(const std::string& line) {
  // The writer's key, exactly (ToJson: no space after the colon); a layer named
  // "analytics" would give a false positive, which parses to no values.
  return line.find("\"analytics\":{") != std::string::npos;
}

}  // namespace keel

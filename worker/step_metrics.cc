// StepMetrics as one JSON line (see step_metrics.h and docs/train.md).
#include "worker/step_metrics.h"

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
  if (evaluated) w.Add("val_loss", val_loss);
  if (skipped) w.Add("skipped", true);
  return w.str();
}

}  // namespace keel
